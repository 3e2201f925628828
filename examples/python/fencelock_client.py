#!/usr/bin/env python3
"""fencelock from Python, with nothing but the .proto files and grpcio.

Generates the stubs from proto/fencelock/v1/*.proto with grpcio-tools into a
temp dir, then acquires, renews and releases a lease, following leader hints
and reading the ErrorDetail that every refusal carries (a google.rpc.Status
in the `grpc-status-details-bin` trailer); publishes a value with the lease
and replaces it (Proclaim), watches the resource's changes (Watch), and
takes a shared lock with two readers.

    python3 -m pip install -r examples/python/requirements.txt
    python3 examples/python/fencelock_client.py --proto-dir proto \
        --endpoints 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003 \
        demo acme/orders/42

`demo` prints one line per step, `event=<name> key=value ...`, which
crates/server/tests/external/python_client.rs checks against a real cluster. The
`Client` class is the part to copy into an application.
"""

import argparse
import importlib
import os
import shutil
import sys
import tempfile
import threading
import time

import grpc
from grpc_status import rpc_status

# How long one call may keep retrying routing refusals (no leader yet,
# NOT_LEADER hops, unknown outcomes) before giving up.
ROUTING_DEADLINE_S = 15.0
# Per-attempt gRPC deadline on top of the server-side wait.
CALL_TIMEOUT_S = 5.0
# First and largest backoff step between retries.
BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 1.0
# The stop-by deadline keeps this share of the TTL back for clock-rate drift
# between this machine and the servers (lock.proto: "a few percent").
DRIFT_MARGIN = 0.05

# Refusals after which the same request may be sent again (with the same
# request_id for an acquire): nothing was decided, or the outcome is unknown.
RETRYABLE_REASONS = {
    "REASON_NOT_LEADER",
    "REASON_LEADER_UNKNOWN",
    "REASON_LEADER_NOT_READY",
    "REASON_NO_QUORUM",
    "REASON_OUTCOME_UNKNOWN",
    "REASON_SERVER_BUSY",
    "REASON_SHUTTING_DOWN",
}
# Transport failures without a detail: the server may never have seen the
# call, or may have applied it; either way a retry is what resolves it.
RETRYABLE_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


def generate_stubs(proto_dir, out_dir):
    """Compiles every .proto of package fencelock.v1 into out_dir and returns
    the imported modules (lock_pb2, lock_pb2_grpc, errors_pb2)."""
    from grpc_tools import protoc

    # The well-known types (google/protobuf/*.proto) ship inside grpc_tools.
    well_known = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    package_dir = os.path.join(proto_dir, "fencelock", "v1")
    protos = sorted(
        os.path.join(package_dir, name)
        for name in os.listdir(package_dir)
        if name.endswith(".proto")
    )
    args = [
        "grpc_tools.protoc",
        "-I" + proto_dir,
        "-I" + well_known,
        "--python_out=" + out_dir,
        "--grpc_python_out=" + out_dir,
    ] + protos
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed on " + " ".join(protos))
    sys.path.insert(0, out_dir)
    return (
        importlib.import_module("fencelock.v1.lock_pb2"),
        importlib.import_module("fencelock.v1.lock_pb2_grpc"),
        importlib.import_module("fencelock.v1.errors_pb2"),
    )


class FencelockError(Exception):
    """A refused call: the gRPC code and, when the server sent one, the
    fencelock.v1.ErrorDetail (reason, retry advice, leader hint, limits)."""

    def __init__(self, code, detail, reason, message):
        super().__init__("%s %s: %s" % (code.name, reason, message))
        self.code = code
        self.detail = detail
        self.reason = reason


class Lease:
    """One holding. `stop_by` is on time.monotonic(): stop the protected work
    when it passes without a successful renew."""

    def __init__(self, resource, response, sent_at):
        self.resource = resource
        self.lease_id = response.lease_id
        self.token = response.fencing_token
        self.shard_id = response.shard_id
        self.deduplicated = response.deduplicated
        self.stop_by = stop_by(sent_at, response.lease_ttl_ms)


def stop_by(sent_at, ttl_ms):
    # From when the request was SENT, never from when the reply came: the
    # server's lease started somewhere in between.
    return sent_at + ttl_ms / 1000.0 * (1.0 - DRIFT_MARGIN)


class Client:
    def __init__(self, endpoints, pb, pb_grpc, errors_pb):
        self._endpoints = list(endpoints)
        self._pb = pb
        self._pb_grpc = pb_grpc
        self._errors_pb = errors_pb
        self._stubs = {}

    def close(self):
        for channel, _ in self._stubs.values():
            channel.close()

    def _stub(self, address):
        if address not in self._stubs:
            # Nodes are addressed directly (leader hints name node addresses),
            # so an HTTP proxy from the environment must not be used.
            channel = grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)])
            self._stubs[address] = (channel, self._pb_grpc.LockServiceStub(channel))
        return self._stubs[address][1]

    def error_from(self, err):
        """Turns a grpc.RpcError into a FencelockError, reading the
        ErrorDetail out of the google.rpc.Status the server attached."""
        detail = None
        status = rpc_status.from_call(err)
        if status is not None:
            for any_detail in status.details:
                if any_detail.Is(self._errors_pb.ErrorDetail.DESCRIPTOR):
                    detail = self._errors_pb.ErrorDetail()
                    any_detail.Unpack(detail)
        if detail is None:
            reason = "REASON_UNSPECIFIED"
        else:
            # A newer server may send a reason this code does not know yet.
            try:
                reason = self._errors_pb.Reason.Name(detail.reason)
            except ValueError:
                reason = "REASON_%d" % detail.reason
        return FencelockError(err.code(), detail, reason, err.details())

    def _call(self, method, request, timeout_s=CALL_TIMEOUT_S):
        """Sends `request`, following NOT_LEADER hints and retrying routing
        refusals. Returns (response, monotonic send time of the attempt that
        was answered)."""
        deadline = time.monotonic() + ROUTING_DEADLINE_S
        address = self._endpoints[0]
        attempt = 0
        backoff = BACKOFF_FIRST_S
        while True:
            sent_at = time.monotonic()
            try:
                stub = self._stub(address)
                return getattr(stub, method)(request, timeout=timeout_s), sent_at
            except grpc.RpcError as err:
                error = self.error_from(err)
            retryable = error.reason in RETRYABLE_REASONS or (
                error.detail is None and error.code in RETRYABLE_CODES
            )
            if not retryable or time.monotonic() >= deadline:
                raise error
            hint = error.detail.leader.address if error.detail is not None else ""
            if error.reason == "REASON_NOT_LEADER" and hint:
                address = hint
                continue
            attempt += 1
            address = self._endpoints[attempt % len(self._endpoints)]
            time.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    def acquire(self, resource, ttl_ms, wait_ms=0, request_id=None, value=b"", shared=False):
        # One request_id for every retry of this acquire: a retry of a
        # committed grant returns that grant instead of a second one.
        request_id = request_id or os.urandom(16)
        request = self._pb.AcquireRequest(
            resource=resource,
            request_id=request_id,
            lease_ttl_ms=ttl_ms,
            wait_timeout_ms=wait_ms,
            value=value,
            mode=self._pb.ACQUIRE_MODE_SHARED if shared else self._pb.ACQUIRE_MODE_EXCLUSIVE,
        )
        response, sent_at = self._call(
            "Acquire", request, timeout_s=CALL_TIMEOUT_S + wait_ms / 1000.0
        )
        lease = Lease(resource, response, sent_at)
        if lease.deduplicated:
            # A retry answered from the dedup table grants only what is left
            # of the original grant (perhaps nothing): renew at once, and
            # give the lease back if that fails past its short deadline.
            try:
                self.renew(lease)
            except FencelockError:
                if time.monotonic() >= lease.stop_by:
                    try:
                        self.release(lease)
                    except FencelockError:
                        pass
                    raise
        return lease, request_id

    def renew(self, lease, ttl_ms=0):
        request = self._pb.RenewRequest(
            resource=lease.resource, lease_id=lease.lease_id, lease_ttl_ms=ttl_ms
        )
        response, sent_at = self._call("Renew", request)
        # The time this answer granted (less than asked near the hold
        # limit); a renewal never takes back a deadline already given.
        lease.stop_by = max(lease.stop_by, stop_by(sent_at, response.lease_ttl_ms))
        return response

    def release(self, lease):
        request = self._pb.ReleaseRequest(resource=lease.resource, lease_id=lease.lease_id)
        response, _ = self._call("Release", request)
        return response.released

    def proclaim(self, lease, value):
        """Replaces the value the holder publishes; the token stays."""
        request = self._pb.ProclaimRequest(
            resource=lease.resource, lease_id=lease.lease_id, value=value
        )
        response, _ = self._call("Proclaim", request)
        return response.fencing_token

    def get(self, resource):
        response, _ = self._call("Get", self._pb.GetRequest(resource=resource))
        return response

    def watch(self, resource):
        """Opens a Watch stream on the first node that takes it (any replica
        serves one). Returns the call: iterate it for WatchEvents, cancel()
        it to stop. A real watcher that loses its stream watches again with
        `after` = the last revision it received, and so misses nothing."""
        last_error = None
        for address in self._endpoints:
            call = self._stub(address).Watch(self._pb.WatchRequest(resource=resource))
            try:
                first = next(call)
            except grpc.RpcError as err:
                last_error = self.error_from(err)
                continue
            return first, call
        raise last_error


def emit(event, **fields):
    parts = ["event=" + event] + ["%s=%s" % (k, v) for k, v in fields.items()]
    print(" ".join(parts), flush=True)


def emit_refusal(event, error, errors_pb):
    detail = error.detail or errors_pb.ErrorDetail()
    emit(
        event,
        code=error.code.name,
        reason=error.reason,
        retry=errors_pb.RetryPolicy.Name(detail.retry),
        holder_expires_at_ms=detail.holder_expires_at_ms,
        queue_length=detail.queue_length,
        field=detail.field or "-",
    )


class Watcher:
    """Follows one resource on a thread: `events` collects (kind, token,
    value) of every WatchEvent after the first STATE."""

    def __init__(self, client, pb, resource):
        self._pb = pb
        self.events = []
        first, self._call = client.watch(resource)
        self.first_kind = pb.WatchEventKind.Name(first.kind)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        try:
            for event in self._call:
                self.events.append(
                    (self._pb.WatchEventKind.Name(event.kind), event.fencing_token, event.value)
                )
        except grpc.RpcError:
            pass  # cancelled by stop(), or the node went away

    def wait_for(self, count, timeout_s=10.0):
        deadline = time.monotonic() + timeout_s
        while len(self.events) < count and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self):
        self._call.cancel()
        self._thread.join(timeout=5)


def demo(client, pb, errors_pb, resource, ttl_ms):
    # Watch the resource first: every change from here on arrives in order.
    watcher = Watcher(client, pb, resource)
    emit("watching", first=watcher.first_kind)

    lease, request_id = client.acquire(resource, ttl_ms, value=b"10.0.0.7:5432")
    first_token = lease.token
    emit(
        "acquired",
        token=lease.token,
        lease_id_len=len(lease.lease_id),
        shard=lease.shard_id,
        stop_by_in_ms=int((lease.stop_by - time.monotonic()) * 1000),
    )

    # Someone else wants it and will not wait: refused with LOCK_HELD, and
    # the detail says until when the holder has it.
    try:
        client.acquire(resource, ttl_ms, wait_ms=0)
        emit("contender_granted")
    except FencelockError as e:
        emit_refusal("contender_refused", e, errors_pb)

    # A lost reply is retried with the same request_id: the original grant
    # comes back, not a second one.
    again, _ = client.acquire(resource, ttl_ms, request_id=request_id)
    emit("retried", token=again.token, deduplicated=again.deduplicated)

    # The holder's published value: read by Get, replaced by a Proclaim.
    emit("published", value=client.get(resource).value.decode())
    proclaimed_token = client.proclaim(lease, b"10.0.0.8:5432")
    emit(
        "proclaimed",
        value=client.get(resource).value.decode(),
        same_token=proclaimed_token == first_token,
    )

    before = lease.stop_by
    renewed = client.renew(lease)
    emit(
        "renewed",
        lease_ttl_ms=renewed.lease_ttl_ms,
        expires_at_ms=renewed.expires_at_ms,
        stop_by_moved=lease.stop_by > before,
    )

    emit("released", released=client.release(lease))
    emit("released_again", released=client.release(lease))

    # The lease is gone: a renew with its id is refused and must stop work.
    try:
        client.renew(lease)
        emit("stale_renew_accepted")
    except FencelockError as e:
        emit_refusal("stale_renew_refused", e, errors_pb)

    second, _ = client.acquire(resource, ttl_ms)
    emit("reacquired", token=second.token, greater=second.token > first_token)
    client.release(second)

    # What the watcher saw: the grant with its token and value, the new
    # value, the release; then the second grant and its release.
    watcher.wait_for(5)
    watcher.stop()
    emit(
        "watched",
        kinds=",".join(kind for kind, _, _ in watcher.events),
        first_grant_token=next(
            (t for kind, t, _ in watcher.events if kind == "WATCH_EVENT_KIND_GRANTED"), 0
        ),
        first_grant_value=next(
            (v.decode() for kind, _, v in watcher.events if kind == "WATCH_EVENT_KIND_GRANTED"),
            "-",
        ),
    )

    # Readers share a lock, each with its own token.
    readers = resource + "/readers"
    r1, _ = client.acquire(readers, ttl_ms, shared=True)
    r2, _ = client.acquire(readers, ttl_ms, shared=True)
    held = client.get(readers)
    emit(
        "shared",
        holders=len(held.holders),
        tokens_rise=r2.token > r1.token,
        mode=pb.AcquireMode.Name(held.mode),
    )
    client.release(r1)
    client.release(r2)

    # Names are validated, never rewritten.
    try:
        client.acquire("Acme/x", ttl_ms)
        emit("bad_name_accepted")
    except FencelockError as e:
        emit_refusal("bad_name_refused", e, errors_pb)

    emit("done")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proto-dir", required=True, help="the repository's proto/ directory")
    parser.add_argument(
        "--gen-dir", help="where to generate the stubs (default: a temp dir, removed at exit)"
    )
    parser.add_argument(
        "--endpoints", required=True, help="comma-separated host:port of the fencelock nodes"
    )
    parser.add_argument("--ttl-ms", type=int, default=5000)
    parser.add_argument("command", choices=["demo"])
    parser.add_argument("resource")
    args = parser.parse_args()

    gen_dir = args.gen_dir or tempfile.mkdtemp(prefix="fencelock-py-")
    try:
        pb, pb_grpc, errors_pb = generate_stubs(args.proto_dir, gen_dir)
        client = Client(args.endpoints.split(","), pb, pb_grpc, errors_pb)
        try:
            demo(client, pb, errors_pb, args.resource, args.ttl_ms)
        finally:
            client.close()
    finally:
        if args.gen_dir is None:
            shutil.rmtree(gen_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
