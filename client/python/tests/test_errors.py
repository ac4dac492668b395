"""Errors: each Warden error code arrives as its own exception class with the server's
detail (decoded from the standard `google.rpc.Status`); the detail decodes with plain
grpcio and `grpc_status.rpc_status.from_call`, without this package's client; bad input is
refused with a typed exception before anything is sent."""

import asyncio

import grpc
import pytest
from grpc_status import rpc_status

import warden
from conftest import LOCK_PREFIX, WATCH_PREFIX
from warden import AsyncClient, Client, NodeKind, Txn, TxnOp
from warden._proto import warden_pb2 as pb
from warden._proto import warden_pb2_grpc as pb_grpc


def test_a_warden_error_decodes_with_the_standard_grpc_status_helper(endpoint: str, prefix: str) -> None:
    """A raw grpcio call (no warden client): the failed call's trailers hold a
    `google.rpc.Status` that `rpc_status.from_call` reads, whose code and message are the
    call's and whose one detail is an `Any` packing a `warden.v1.WardenError`."""
    with grpc.insecure_channel(endpoint) as channel:
        stub = pb_grpc.WardenStub(channel)
        with pytest.raises(grpc.RpcError) as failed:
            stub.Get(pb.GetRequest(path=f"{prefix}/missing"), timeout=10)
        call = failed.value
        assert call.code() == grpc.StatusCode.NOT_FOUND
        status = rpc_status.from_call(call)
        assert status is not None, "no grpc-status-details-bin trailer"
        assert status.code == grpc.StatusCode.NOT_FOUND.value[0]
        assert status.message == call.details()
        assert len(status.details) == 1
        (detail,) = status.details
        assert detail.type_url == "type.googleapis.com/warden.v1.WardenError"
        error = pb.WardenError()
        assert detail.Unpack(error)
        assert error.code == pb.WardenError.NO_NODE
        assert error.path == f"{prefix}/missing"
        assert error.message == call.details()

        # A refused create too: another code, the same envelope.
        stub.Create(pb.CreateRequest(path=f"{prefix}/dup", create_parents=True), timeout=10)
        with pytest.raises(grpc.RpcError) as again:
            stub.Create(pb.CreateRequest(path=f"{prefix}/dup"), timeout=10)
        status = rpc_status.from_call(again.value)
        assert status is not None and status.code == grpc.StatusCode.ALREADY_EXISTS.value[0]
        assert status.details[0].Unpack(error) and error.code == pb.WardenError.NODE_EXISTS


def test_each_error_code_is_its_own_exception(endpoint: str, prefix: str) -> None:
    """The server's refusals arrive typed, with the path, code, gRPC code and the detail."""
    with Client([endpoint]) as client:
        client.create(f"{prefix}/a/b", create_parents=True)
        cases = [
            (warden.NoNodeError, lambda: client.get(f"{prefix}/nope"), warden.ErrorCode.NO_NODE),
            (warden.NodeExistsError, lambda: client.create(f"{prefix}/a"), warden.ErrorCode.NODE_EXISTS),
            (warden.BadVersionError, lambda: client.set(f"{prefix}/a", b"", expected_version=7), warden.ErrorCode.BAD_VERSION),
            (warden.NotEmptyError, lambda: client.delete(f"{prefix}/a"), warden.ErrorCode.NOT_EMPTY),
            (warden.InvalidPathError, lambda: client.get("relative/path"), warden.ErrorCode.INVALID_PATH),
            (warden.InvalidPathError, lambda: client.create(f"{prefix}//double"), warden.ErrorCode.INVALID_PATH),
            (
                warden.TooLargeError,
                lambda: client.create(f"{prefix}/big", b"x" * ((1 << 20) + 1)),
                warden.ErrorCode.TOO_LARGE,
            ),
            (
                warden.InvalidArgumentError,
                lambda: client.txn(Txn().then(TxnOp.get(f"{LOCK_PREFIX}/x")).then(TxnOp.get(f"{WATCH_PREFIX}/y"))),
                warden.ErrorCode.INVALID_ARGUMENT,
            ),
        ]
        for cls, call, code in cases:
            with pytest.raises(cls) as failed:
                call()
            error = failed.value
            assert isinstance(error, warden.WardenError)
            assert error.code == code, (cls, error)
            assert error.detail is not None and error.detail.code == int(code)
            assert error.grpc_code is not None and error.grpc_code != grpc.StatusCode.OK
            assert error.message
        too_large = pytest.raises(warden.TooLargeError, client.create, f"{prefix}/big", b"x" * ((1 << 20) + 1))
        assert too_large.value.limit == 1 << 20

        with client.session(ttl_s=5) as session:
            client.create(f"{prefix}/eph", session=session)
            with pytest.raises(warden.NoChildrenForEphemeralsError):
                client.create(f"{prefix}/eph/child")
            gone = session.id
        with pytest.raises(warden.SessionExpiredError) as expired:
            client.create(f"{prefix}/late", session=gone)
        assert expired.value.code == warden.ErrorCode.SESSION_EXPIRED


def test_bad_input_is_refused_before_anything_is_sent(endpoint: str, prefix: str) -> None:
    """Arguments the API cannot send are InvalidArgumentError (a ValueError too)."""

    async def body() -> None:
        for endpoints in ([], ["no-port"], ["host:99999"], [7]):
            with pytest.raises(warden.InvalidArgumentError):
                await AsyncClient.connect(endpoints)  # type: ignore[arg-type]
        with pytest.raises(warden.InvalidArgumentError):
            await AsyncClient.connect([endpoint], token="has space")
        with pytest.raises(warden.InvalidArgumentError):
            await AsyncClient.connect([endpoint], request_timeout_s=-1)
        async with AsyncClient.connect([endpoint]) as client:
            bad = [
                lambda: client.create(f"{prefix}/x", 42),  # type: ignore[arg-type]
                lambda: client.create(f"{prefix}/x", kind=NodeKind.TTL),
                lambda: client.create(f"{prefix}/x", ttl_s=5),
                lambda: client.create(f"{prefix}/x", kind=NodeKind.TTL, ttl_s=-1),
                lambda: client.create(f"{prefix}/x", kind=NodeKind.CONTAINER, session=5),
                lambda: client.create(f"{prefix}/x", session=0),
                lambda: client.set(f"{prefix}/x", b"", expected_version=-1),
                lambda: client.get(b"/bytes"),  # type: ignore[arg-type]
                lambda: client.children_page("/", limit=1 << 40),
                lambda: client.session(ttl_s=0),
                lambda: client.txn("not a txn"),  # type: ignore[arg-type]
                lambda: client.watch("/", kinds=[]),
                lambda: client.watch_once("/", "DATA"),  # type: ignore[arg-type]
            ]
            for make in bad:
                with pytest.raises(ValueError):
                    await make()
            async with client.session(ttl_s=5) as session:
                with pytest.raises(warden.InvalidArgumentError):
                    await session.try_lock(f"{prefix}/lock", lock_delay_s=61)
                with pytest.raises(warden.InvalidArgumentError):
                    await session.try_lock(f"{prefix}/lock", mode="SHARED")  # type: ignore[arg-type]

    asyncio.run(body())
