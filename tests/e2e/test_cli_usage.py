"""Usage errors read like gpusnap's own: one line on stderr, `gpusnap: error:`,
the flag or command at fault named, exit status 2, and nothing started.
--help still prints the help and exits 0."""
import os
import unittest

from harness import GpusnapCase

PREFIX = "gpusnap: error: "


class UsageErrors(GpusnapCase):
    def assert_usage_error(self, args, *needles):
        p = self.gs(*args, check=False)
        what = f"gpusnap {' '.join(args)}: exit {p.returncode}, stderr:\n{p.stderr}"
        self.assertEqual(p.returncode, 2, what)
        lines = p.stderr.splitlines()
        self.assertEqual(len(lines), 1, what)
        self.assertTrue(lines[0].startswith(PREFIX), what)
        for needle in needles:
            self.assertIn(needle, lines[0], what)
        self.assertEqual(p.stdout, "", what)
        self.assertEqual(self.workloads(), [], what)  # nothing was started
        return lines[0]

    def test_flag_of_other_subcommands_names_them(self):
        line = self.assert_usage_error(["run", "--name", "w", "--store", "/tmp/x", "--", "sleep", "100"], "--store")
        self.assertRegex(line, r"--store is an option of checkpoint, restore, ls\b.*; not of run")

    def test_flag_of_no_subcommand(self):
        self.assert_usage_error(["checkpoint", "w", "--bogus-flag"], "--bogus-flag", "checkpoint")
        self.assert_usage_error(["ps", "--bogus-flag=3"], "--bogus-flag", "ps")

    def test_unknown_command(self):
        line = self.assert_usage_error(["foo"])
        self.assertEqual(line, PREFIX + "unknown command `foo` (see gpusnap --help)")
        line = self.assert_usage_error(["cuda", "frobnicate", "1"])
        self.assertEqual(line, PREFIX + "unknown command `cuda frobnicate` (see gpusnap cuda --help)")

    def test_missing_command(self):
        self.assert_usage_error([], "a command is required", "gpusnap --help")
        self.assert_usage_error(["gpushare"], "a command is required", "gpusnap gpushare --help")

    def test_missing_required_option_and_argument(self):
        self.assert_usage_error(["run", "--", "sleep", "100"], "run", "--name")
        self.assert_usage_error(["run", "--name", "w"], "run", "command")
        self.assert_usage_error(["checkpoint"], "checkpoint", "target")

    def test_missing_and_bad_values(self):
        self.assert_usage_error(["restore", "snap", "--name"], "restore", "--name")
        self.assert_usage_error(["checkpoint", "w", "--timeout", "soon"], "checkpoint", "--timeout", "soon")

    def test_malformed_size_for_gc(self):
        for bad in ("12x", "-1G", "1.5", "20 G", ""):
            line = self.assert_usage_error(["gc", "--keep-unused", bad], "gc", "--keep-unused", f"`{bad}` is not a size")
            self.assertIn("(see gpusnap gc --help)", line)
        self.assert_usage_error(["gc", "--keep-unused"], "gc", "--keep-unused")

    def test_criu_config_that_does_not_exist(self):
        missing = os.path.join(self.tmp, "no-such.conf")
        self.assert_usage_error(["checkpoint", "w", "--criu-config", missing], "--criu-config", missing)
        self.assert_usage_error(["restore", "snap", "--criu-config", missing], "--criu-config", missing)

    def test_help_still_works(self):
        for args in (["--help"], ["run", "--help"], ["cuda", "--help"], ["cuda", "lock", "--help"]):
            p = self.gs(*args)
            self.assertEqual(p.returncode, 0, args)
            self.assertIn("Usage:", p.stdout, args)


if __name__ == "__main__":
    unittest.main()
