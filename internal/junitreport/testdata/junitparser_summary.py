"""Print what junitparser reads from a JUnit XML file, as JSON."""
import json
import sys

from junitparser import Error, Failure, JUnitXml, Skipped

xml = JUnitXml.fromfile(sys.argv[1])
out = {"tests": xml.tests, "failures": xml.failures, "errors": xml.errors, "skipped": xml.skipped, "suites": []}
for suite in xml:
    s = {"name": suite.name, "tests": suite.tests, "failures": suite.failures, "errors": suite.errors,
         "properties": {p.name: p.value for p in suite.properties()}, "cases": []}
    for case in suite:
        kind = "passed"
        message = ""
        for r in case.result:
            if isinstance(r, Error):
                kind = "error"
            elif isinstance(r, Failure):
                kind = "failure"
            elif isinstance(r, Skipped):
                kind = "skipped"
            message = r.message or ""
        s["cases"].append({"name": case.name, "classname": case.classname, "result": kind, "message": message})
    out["suites"].append(s)
json.dump(out, sys.stdout, sort_keys=True)
