"""Reading materializerd's Prometheus endpoint in tests."""

import re
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

METRICS_LINE = re.compile(r"metrics on http://(\S+?)/metrics")


def metrics_url(srv, timeout=30):
    """The /metrics URL the server logged at start-up (--metrics_listen
    with port 0 picks the port)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(srv.log_path, encoding="utf-8", errors="replace") as f:
            m = METRICS_LINE.search(f.read())
        if m:
            return f"http://{m.group(1)}/metrics"
        time.sleep(0.05)
    raise AssertionError("the server logged no 'metrics on http://...' line")


def scrape(url):
    """{(sample name, frozenset(labels.items())): value} of one scrape."""
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200
        assert r.headers.get("Content-Type", "").startswith("text/plain")
        text = r.read().decode("utf-8")
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def value(samples, name, **labels):
    """One sample; AssertionError naming it if absent."""
    key = (name, frozenset(labels.items()))
    assert key in samples, f"no sample {name}{labels}"
    return samples[key]


def get(samples, name, default=0.0, **labels):
    """One sample, or `default` where the series does not exist (yet)."""
    return samples.get((name, frozenset(labels.items())), default)
