"""run_module.py, the runner ctest starts each module with: its exit status
tells a skip (77) from a pass (0) and a failure (1), and it lists every
skipped test, also in a module that passed. Runs it on small modules written
here; needs nothing else."""
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run_module.py")

MODULES = {
    "all_skip": """
        import unittest
        class A(unittest.TestCase):
            def test_a(self):
                self.skipTest("no runc here")
            @unittest.skip("needs a GPU")
            def test_b(self):
                pass
    """,
    "class_skip": """
        import unittest
        class A(unittest.TestCase):
            @classmethod
            def setUpClass(cls):
                raise unittest.SkipTest("needs root")
            def test_a(self):
                pass
    """,
    "some_skip": """
        import unittest
        class A(unittest.TestCase):
            def test_a(self):
                pass
            def test_b(self):
                self.skipTest("this kernel gives no io_uring")
    """,
    "one_fails": """
        import unittest
        class A(unittest.TestCase):
            def test_a(self):
                self.fail("boom")
            def test_b(self):
                self.skipTest("not here")
    """,
    "errors_at_import": """
        raise RuntimeError("broken module")
    """,
    "exits_77_at_import": """
        import sys
        print("SKIP: no working kubectl", file=sys.stderr)
        sys.exit(77)
    """,
    "no_tests": """
        VALUE = 1
    """,
}


class RunModule(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="gpusnap-run-module-")
        for name, text in MODULES.items():
            with open(os.path.join(cls.dir, f"mod_{name}.py"), "w") as f:
                f.write(textwrap.dedent(text))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def run_module(self, name):
        skips = os.path.join(self.dir, f"skips-{name}.txt")
        p = subprocess.run([sys.executable, RUNNER, f"mod_{name}", "--skips-file", skips], cwd=self.dir,
                           capture_output=True, text=True, timeout=60)
        listed = open(skips).read() if os.path.exists(skips) else ""
        return p.returncode, p.stdout.strip().splitlines()[-1] if p.stdout.strip() else "", listed

    def test_a_module_whose_tests_all_skip_is_skipped(self):
        rc, last, listed = self.run_module("all_skip")
        self.assertEqual(rc, 77, last)
        self.assertIn("0 passed, 0 failed, 2 skipped", last)
        self.assertIn("mod_all_skip.A.test_a (no runc here)", last)
        self.assertIn("mod_all_skip.A.test_b (needs a GPU)", last)
        self.assertEqual(listed, "mod_all_skip: mod_all_skip.A.test_a: no runc here\n"
                                 "mod_all_skip: mod_all_skip.A.test_b: needs a GPU\n")

    def test_a_skipped_class_is_skipped(self):
        rc, last, listed = self.run_module("class_skip")
        self.assertEqual(rc, 77, last)
        self.assertIn("needs root", listed)

    def test_a_module_that_passes_still_lists_its_skips(self):
        rc, last, listed = self.run_module("some_skip")
        self.assertEqual(rc, 0, last)
        self.assertIn("1 passed, 0 failed, 1 skipped: mod_some_skip.A.test_b (this kernel gives no io_uring)", last)
        self.assertEqual(listed, "mod_some_skip: mod_some_skip.A.test_b: this kernel gives no io_uring\n")

    def test_a_failure_fails_whatever_was_skipped(self):
        rc, last, _ = self.run_module("one_fails")
        self.assertEqual(rc, 1, last)
        self.assertIn("0 passed, 1 failed, 1 skipped", last)

    def test_a_module_that_cannot_be_imported_fails(self):
        rc, last, listed = self.run_module("errors_at_import")
        self.assertEqual(rc, 1, last)
        self.assertEqual(listed, "")

    def test_a_module_that_exits_77_at_import_is_skipped_with_its_reason(self):
        rc, last, listed = self.run_module("exits_77_at_import")
        self.assertEqual(rc, 77, last)
        self.assertEqual(listed, "mod_exits_77_at_import: (all): SKIP: no working kubectl\n")

    def test_a_module_without_tests_fails(self):
        rc, last, _ = self.run_module("no_tests")
        self.assertEqual(rc, 1, last)
        self.assertIn("no test ran", last)


if __name__ == "__main__":
    unittest.main()
