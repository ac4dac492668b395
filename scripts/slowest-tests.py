#!/usr/bin/env python3
"""Prints the slowest tests of a `cargo nextest` run from its JUnit report (standard library
only): `scripts/slowest-tests.py JUNIT_XML [COUNT]`. `make test` calls it after the tests,
passed or not, so each run shows where its time went."""

import sys
import xml.etree.ElementTree as ElementTree


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    count = int(sys.argv[2]) if len(sys.argv) == 3 else 10
    try:
        root = ElementTree.parse(sys.argv[1]).getroot()
    except (OSError, ElementTree.ParseError) as error:
        print(f"slowest tests: no report ({error})", file=sys.stderr)
        return 1
    cases = []
    for case in root.iter("testcase"):
        seconds = float(case.get("time", "0") or 0)
        cases.append((seconds, f"{case.get('classname', '')} {case.get('name', '')}"))
    cases.sort(reverse=True)
    total = sum(seconds for seconds, _ in cases)
    print(f"\nslowest {min(count, len(cases))} of {len(cases)} tests ({total / 60:.1f} min of test time in all):")
    for seconds, name in cases[:count]:
        print(f"  {seconds:8.1f} s  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
