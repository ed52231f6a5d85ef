#!/usr/bin/env python3
"""run_module.py MODULE [--skips-file FILE] - run one unittest module (from
the current directory) the way `python -m unittest -v MODULE` does, and tell
ctest a skip from a pass:

  exit 1   any test failed or errored, or the module holds no test;
  exit 77  no test passed and at least one was skipped (ctest's
           SKIP_RETURN_CODE), also when the module skips itself at import
           by exiting 77;
  exit 0   otherwise (some may have been skipped).

The last line printed names every skipped test with its reason. With
--skips-file (or $GPUSNAP_SKIPS_FILE), each skipped test is also appended to
FILE as "MODULE: TEST: REASON", so that a run of the whole suite can list the
skips of modules that otherwise passed (scripts/test.sh prints them)."""
import argparse
import os
import sys
import unittest

SKIPPED = 77


class CountingResult(unittest.TextTestResult):
    """Counts the tests that passed, which TextTestResult does not."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.passed = 0

    def addSuccess(self, test):
        super().addSuccess(test)
        self.passed += 1

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self.passed += 1


class Tee:
    """A stream that writes through to `inner` and keeps what it wrote."""

    def __init__(self, inner):
        self.inner = inner
        self.text = ""

    def write(self, text):
        self.text += text
        return self.inner.write(text)

    def flush(self):
        self.inner.flush()

    def __getattr__(self, name):
        return getattr(self.inner, name)


def record(skips_file, module, skipped):
    if not skips_file or not skipped:
        return
    try:
        with open(skips_file, "a", encoding="utf-8") as f:
            for name, reason in skipped:
                f.write(f"{module}: {name}: {reason}\n")
    except OSError as e:
        print(f"{module}: cannot list the skipped tests in `{skips_file}`: {e.strerror}", file=sys.stderr)


def one_line(text):
    return " ".join(str(text).split())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("module")
    parser.add_argument("--skips-file", default=os.environ.get("GPUSNAP_SKIPS_FILE", ""))
    args = parser.parse_args()
    # As `python -m unittest` does: the modules are found from the current directory.
    sys.path.insert(0, os.getcwd())
    said = Tee(sys.stderr)
    sys.stderr = said
    try:
        suite = unittest.defaultTestLoader.loadTestsFromName(args.module)
    except SystemExit as e:
        if e.code == SKIPPED:
            # Its reason: the last line it wrote before exiting.
            lines = [line for line in said.text.splitlines() if line.strip()]
            reason = one_line(lines[-1]) if lines else "the module exited 77 at import"
            record(args.skips_file, args.module, [("(all)", reason)])
            print(f"{args.module}: skipped: {reason}")
            sys.exit(SKIPPED)
        raise
    finally:
        sys.stderr = said.inner
    result = unittest.TextTestRunner(verbosity=2, resultclass=CountingResult).run(suite)
    skipped = [(one_line(test.id() if hasattr(test, "id") else test), one_line(reason))
               for test, reason in result.skipped]
    record(args.skips_file, args.module, skipped)
    bad = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    listing = "; ".join(f"{name} ({reason})" for name, reason in skipped)
    summary = f"{args.module}: {result.passed} passed, {bad} failed, {len(skipped)} skipped"
    print(summary + (f": {listing}" if listing else ""))
    if bad:
        sys.exit(1)
    if result.passed == 0:
        if skipped:
            sys.exit(SKIPPED)
        print(f"{args.module}: no test ran")
        sys.exit(1)
    sys.exit(0)


if __name__ == "__main__":
    main()
