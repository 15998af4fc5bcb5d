"""The rules, natively: ./build.sh test."""

import unittest

import nyann_policy as nyann
from app import rule


class RuleTest(unittest.TestCase):
    def test_slow_stage_is_congested(self):
        stage = nyann.observation(client=dict(ttft_p99_seconds=3.0, requests_ok=100))
        self.assertTrue(rule(2.0, 0.01, stage).congested)
        self.assertEqual(rule(2.0, 0.01, stage).reasons, ["client TTFT p99 3.000s > 2s"])
        self.assertFalse(rule(5.0, 0.01, stage).congested)

    def test_params_are_checked(self):
        with self.assertRaises(nyann.PolicyError):
            nyann.Params.of(ttft_p99=0.0).require_positive("ttft_p99")


if __name__ == "__main__":
    unittest.main()
