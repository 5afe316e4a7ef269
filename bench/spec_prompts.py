"""The chats of the speculation benchmarks (`spec-vs-llama.sh`, `spec-bound.py`): a quoting set
(answer by quoting a given document, fill in a given form, edit a given code file) and a novel
set (open questions)."""

DOCUMENT = """Discharge summary. Patient: Maria Keller, born 1958-04-17, admitted 2026-11-20 with
community-acquired pneumonia of the right lower lobe. Treatment: amoxicillin-clavulanate 875/125 mg
twice daily for seven days, oxygen by nasal cannula for the first two days. Course: fever settled
on day three; CRP fell from 148 to 22 mg/L. Discharged 2026-11-26 in good condition. Follow-up:
chest X-ray in six weeks at the Lindenstrasse practice; see the GP within one week. Medication at
discharge: amoxicillin-clavulanate until 2026-11-27, then stop; continue ramipril 5 mg once daily."""
CODE = """def parse_reading(line):
    parts = line.strip().split(",")
    sensor = parts[0]
    value = float(parts[1])
    unit = parts[2]
    return {"sensor": sensor, "value": value, "unit": unit}


def parse_file(path):
    readings = []
    with open(path) as f:
        for line in f:
            readings.append(parse_reading(line))
    return readings
"""
SETS = {
    "quoting": [
        f"{DOCUMENT}\n\nQuote the treatment and the follow-up sentences of this summary word for word.",
        f"{DOCUMENT}\n\nFill in this form from the summary, copying the values exactly:\nPatient:\nBorn:\nAdmitted:\nDischarged:\nMedication at discharge:",
        f"{CODE}\nRewrite this code so that parse_reading skips empty lines (return None) and parse_file leaves out the None results. Give the whole file.",
    ],
    "novel": [
        "Why do leaves change colour in autumn?",
        "Give three tips for sleeping better.",
        "Explain what a fever is to a child.",
    ],
}
