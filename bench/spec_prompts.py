"""The chats of the speculation benchmarks (`spec-vs-llama.sh`, `spec-bound.py`): a quoting set
(answer by quoting a given document, fill in a given form, edit a given code file) and a novel
set (open questions), and a held-out pair of sets of the same kinds.

`HELD_OUT` was written after the planner was tuned on `SETS` and has not been tuned on since:
a change to the planner or the lookup that gains on `SETS` but not here is fitted to three
answers (`bench/spec-bound.py --chats held-out --replay`)."""

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
LETTER = """Referral. Dear colleague, I am referring Mr Jonas Weber, born 1971-09-02, for assessment of
exertional chest pain of three months' duration. Resting ECG shows sinus rhythm at 68/min without ST changes.
Blood pressure 148/92 mmHg on two occasions. LDL cholesterol 4.1 mmol/L, HbA1c 5.9 %. Current medication:
amlodipine 5 mg once daily, atorvastatin 20 mg at night. He smokes ten cigarettes a day. Please arrange an
exercise stress test and advise on further management. Kind regards, Dr Anna Brandt, Lindenstrasse practice."""
POLICY = """Data protection policy, section 4. Patient records are stored only on the practice server in the
locked room. Records may be printed only for a patient's own appointment and must be shredded the same day.
Staff may not send records by e-mail; referrals go by the secure messaging system. A breach must be reported
to the practice manager within 24 hours and to the supervisory authority within 72 hours."""
CONFIG = """[server]
host = "127.0.0.1"
port = 8080
threads = 2

[model]
path = "/var/lib/appliance/models/smollm2.gguf"
context = 2048
temperature = 0.7
"""
JS = """function total(items) {
  let sum = 0;
  for (const item of items) {
    sum += item.price * item.quantity;
  }
  return sum;
}

function describe(items) {
  return items.map((item) => item.name + ": " + item.quantity).join("\\n");
}
"""
HELD_OUT = {
    "quoting": [
        f"{LETTER}\n\nQuote the sentence about the medication and the sentence about the blood pressure exactly.",
        f"{LETTER}\n\nFill in this form from the letter, copying the values exactly:\nPatient:\nBorn:\nBlood pressure:\nLDL cholesterol:\nHbA1c:\nMedication:",
        f"{POLICY}\n\nRepeat the rules of this policy as a numbered list, using the policy's own words.",
        f"{CONFIG}\nChange the port to 9090 and the context to 4096. Give the whole file.",
        f"{JS}\nRename the function total to orderTotal and add a JSDoc comment to each function. Give the whole code.",
        f"{POLICY}\n\nWhat does the policy say about e-mail? Quote it.",
    ],
    "novel": [
        "Write a short poem about the sea.",
        "What are the benefits of regular exercise?",
        "How does a refrigerator work?",
        "Suggest a name for a bakery and explain why.",
    ],
}
