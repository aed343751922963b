"""The RPC fuzzer (rpc_fuzzer.py) at fixed seeds, as part of ./dev test:
every RPC from two clients, with bad fields, bad wire bytes and cancelled
calls, against a server of its own. Passes only with no crash, no hang (a
refused call over 5 s), no INTERNAL/UNKNOWN, no unclear error, no
isolation breach, no memory left behind and bounded server RSS. Longer
runs: `python tests/python/rpc_fuzzer.py --requests 10000 --seed S`."""

import rpc_fuzzer

NO_FINDINGS = {kind: 0 for kind in rpc_fuzzer.Findings.KINDS}


def check(fuzzer):
    report = fuzzer.report()
    print("\n" + report)
    assert fuzzer.findings.counts() == NO_FINDINGS, report


def test_every_rpc_two_identities_fixed_seed():
    check(rpc_fuzzer.run(requests=3000, seed=1))


def test_bearer_tokens_two_identities_on_one_connection():
    # Each call names its caller: a connection must not remember the
    # identity of an earlier call.
    check(rpc_fuzzer.run(requests=1000, seed=2, tokens=True,
                         regressions=False))
