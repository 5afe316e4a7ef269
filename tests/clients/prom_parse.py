#!/usr/bin/env python3
"""A Prometheus text exposition on stdin, read by the `prometheus_client` package's parser;
prints it as JSON: {family: {"type", "help", "samples": [{"name", "labels", "value"}]}}.

Families are named as the parser names them (a counter `x_total` is family `x`, its samples
`x_total`). Values that JSON cannot hold are strings: "NaN", "+Inf", "-Inf". Exits 1 with the
reason when the text does not parse, a family appears twice, or a sample belongs to no declared
family (the parser would make it an `untyped` family of its own)."""
import json
import math
import sys

from prometheus_client.parser import text_string_to_metric_families


def value(v):
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return v


families = {}
try:
    for family in text_string_to_metric_families(sys.stdin.read()):
        if family.name in families:
            sys.exit(f"family {family.name} appears twice")
        if family.type in ("untyped", "unknown"):
            sys.exit(f"{family.name} has no # TYPE line of its own (a sample outside its family?)")
        families[family.name] = {
            "type": family.type,
            "help": family.documentation,
            "samples": [{"name": s.name, "labels": s.labels, "value": value(s.value)} for s in family.samples],
        }
except ValueError as e:
    sys.exit(f"not Prometheus text: {e!r}")
json.dump(families, sys.stdout, indent=1, sort_keys=True)
print()
