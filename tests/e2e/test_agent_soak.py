"""The CPU soak of the node agent (bench/agent_soak.py), CI-sized: a few
hundred checkpoint, restore and kill cycles of a counter through the agent's
API, with API reads beside them; every restored tree runs at once and counts
on, and the agent holds as much after the cycles as after the warm-up (its
memory, descriptors, threads and job records, within the soak's stated
tolerances). GPUSNAP_SOAK_CYCLES sets the cycles (default CI_CYCLES)."""
import os
import sys
import unittest

from harness import WORKLOADS, require_built, require_root

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import agent_soak  # noqa: E402

CI_CYCLES = 200


class AgentSoak(unittest.TestCase):
    def test_the_agent_holds_as_much_after_the_cycles_as_after_the_warmup(self):
        require_root(self)
        require_built(self, (os.path.join(WORKLOADS, "counter"), "wl_counter"))
        cycles = int(os.environ.get("GPUSNAP_SOAK_CYCLES", CI_CYCLES))
        report = agent_soak.soak(cycles)
        summary = (f"{cycles} cycles in {report['seconds']} s, {report['api_reads']} API reads\n"
                   f"{agent_soak.table(report)}")
        print(summary)
        self.assertEqual(report["api_read_errors"], [])
        self.assertTrue(all(f["ok"] for f in report["figures"].values()), f"{summary}\n{report['agent_log_tail']}")
        self.assertEqual(report["figures"]["journal_records"]["end"], agent_soak.MAX_JOB_RECORDS)
        self.assertGreater(report["api_reads"], cycles)


if __name__ == "__main__":
    unittest.main()
