"""Statuses a careless client gets: bytes that do not parse are
INVALID_ARGUMENT naming the message (for every RPC, streams included), and
error messages quote at most a bounded part of an input, so a 1 MB handle id
or pattern still comes back as NOT_FOUND / INVALID_ARGUMENT rather than as a
RESOURCE_EXHAUSTED about metadata size."""

import grpc
import pytest

import serverproc

# Field 1 with wire type 7 (there is no such wire type): no message parses.
GARBAGE = b"\x0f\xff\xff\xff"
UNARY = {
    "Plan": "PlanRequest",
    "Materialize": "MaterializeRequest",
    "Describe": "DescribeRequest",
    "DescribeFile": "FetchRequest",
    "ExportHandle": "ExportRequest",
    "CloseExport": "CloseExportRequest",
    "Release": "ReleaseRequest",
    "ListHandles": "ListHandlesRequest",
    "GetStats": "GetStatsRequest",
    "Renew": "RenewRequest",
}
# A message this long travels comfortably in a trailer (gRPC's default limit
# for all metadata is 8 KiB).
MAX_MESSAGE = 4096
HUGE = 1 << 20


@pytest.mark.parametrize("method", sorted(UNARY))
def test_unparseable_unary_request_is_invalid_argument(server, method):
    with pytest.raises(grpc.RpcError) as e:
        serverproc.raw_unary(server.channel, method, GARBAGE, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, \
        (method, e.value.code(), e.value.details())
    assert f"materializer.v1.{UNARY[method]}" in e.value.details()
    server.assert_idle()


def test_unparseable_stream_requests_are_invalid_argument(server):
    fetch = server.channel.unary_stream(
        serverproc.SERVICE_PATH + "FetchWeights", request_serializer=None,
        response_deserializer=None)
    with pytest.raises(grpc.RpcError) as e:
        list(fetch(GARBAGE, timeout=30))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "materializer.v1.FetchRequest" in e.value.details()

    attach = server.channel.stream_stream(
        serverproc.SERVICE_PATH + "Attach", request_serializer=None,
        response_deserializer=None)
    answers = []
    with pytest.raises(grpc.RpcError) as e:
        for answer in attach(iter([GARBAGE]), timeout=30):
            answers.append(answer)
    assert answers == []
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "materializer.v1.AttachRequest" in e.value.details()
    assert server.stats().clients == []  # no session was opened


def expect(call, code):
    with pytest.raises(grpc.RpcError) as e:
        call()
    details = e.value.details() or ""
    assert e.value.code() == code, (e.value.code(), details[:300])
    assert len(details) <= MAX_MESSAGE, len(details)
    return details


def test_huge_inputs_are_quoted_in_part(server):
    pb = server.pb
    big_id = "h-" + "0" * HUGE
    for call in (
            lambda: server.describe(big_id),
            lambda: server.release(big_id),
            lambda: server.stub.Renew(pb.RenewRequest(handle=big_id),
                                      timeout=30),
            lambda: server.fetch_chunks(big_id),
            lambda: server.stub.DescribeFile(pb.FetchRequest(handle=big_id),
                                             timeout=30),
            lambda: server.stub.ExportHandle(
                pb.ExportRequest(handle=big_id), timeout=30),
            lambda: server.stub.CloseExport(
                pb.CloseExportRequest(export_id="x-" + big_id), timeout=30),
            lambda: server.stub.CloseExport(
                pb.CloseExportRequest(export_id=big_id), timeout=30)):
        details = expect(call, grpc.StatusCode.NOT_FOUND)
        assert " bytes)" in details and "not found" in details, details[:300]

    # Inputs inside a request: a pattern, a tensor name, a dtype, a device.
    model = ('{"model": {"tensors": [{"name": "w", "shape": [4], '
             '"dtype": "float32"}], "initRules": [{"pattern": "%s", '
             '"init": {"zeros": {}}}]}}')
    req = server.parse_request(model % ("[" * HUGE), pb.PlanRequest)
    details = expect(lambda: server.stub.Plan(req, timeout=60),
                     grpc.StatusCode.INVALID_ARGUMENT)
    assert "model.init_rules[0]" in details
    req = server.parse_request(
        '{"model": {"tensors": [{"name": "%s", "shape": [4], '
        '"dtype": "float32"}]}}' % ("n" * HUGE), pb.PlanRequest)
    details = expect(lambda: server.stub.Plan(req, timeout=60),
                     grpc.StatusCode.INVALID_ARGUMENT)
    assert "model.tensors[0]" in details and "the limit is 512" in details
    req = server.parse_request(
        '{"model": {"tensors": [{"name": "w", "shape": [4], '
        '"dtype": "%s"}]}}' % ("f" * HUGE), pb.PlanRequest)
    details = expect(lambda: server.stub.Plan(req, timeout=60),
                     grpc.StatusCode.INVALID_ARGUMENT)
    assert "unknown dtype" in details
    req = server.parse_request(model % "*", pb.MaterializeRequest)
    req.placement.device = "cuda:" + "9" * HUGE
    details = expect(lambda: server.materialize(req),
                     grpc.StatusCode.INVALID_ARGUMENT)
    assert "placement" in details
    server.assert_idle()


def test_huge_fetch_filters_are_quoted_in_part(server):
    pb = server.pb
    req = server.parse_request(
        '{"model": {"tensors": [{"name": "w", "shape": [4], '
        '"dtype": "float32"}], "initRules": [{"pattern": "*", '
        '"init": {"ones": {}}}]}}')
    with server.handle(req) as h:
        for field in ("include", "exclude"):
            details = expect(
                lambda: server.fetch_chunks(h.handle, **{field: ["x" * HUGE]}),
                grpc.StatusCode.INVALID_ARGUMENT)
            assert f"{field}[0]" in details, details[:300]
            details = expect(
                lambda: server.stub.DescribeFile(
                    pb.FetchRequest(handle=h.handle, **{field: ["x" * HUGE]}),
                    timeout=30),
                grpc.StatusCode.INVALID_ARGUMENT)
            assert f"{field}[0]" in details, details[:300]
    server.assert_idle()
