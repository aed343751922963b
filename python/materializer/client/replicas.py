"""The servers behind a client's address, and where each call goes.

The protocol is docs/api.md, "Several replicas" (the C++ client follows
the same rules, client/replica_set.h):

    "127.0.0.1:50051"                          one server: no discovery
    "10.0.0.5:50051,10.0.0.6:50051"            replicas listed by hand
    "materializer.ml.svc.cluster.local:50051"  a headless Service: one
                                               address per ready pod
    "unix:/run/materializer.sock"              a gRPC target with a scheme:
                                               one server, passed as is

With several addresses, GetServerInfo at each says which replica answers
there, where it advertises itself and how much memory each of its devices
has free. Handle and export ids name their replica (`h-<32 hex>@r1`), so a
call about a handle goes to the replica the id names; Materialize and Plan
go to the replica with the most room for the placement.
"""

import ipaddress
import socket
import threading

import grpc

from materializer._proto import pb
from materializer.errors import RpcError

# GetServerInfo at each address is given this long (as in the C++ client).
DISCOVERY_TIMEOUT_S = 5.0
_SCHEMES = ("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:", "vsock:")
_GONE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
_REFUSED_CODES = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


def replica_of_id(id_):
    """The replica a handle or export id names: the text after its last
    '@', or "" when it has none (a single server's ids)."""
    at = id_.rfind("@")
    return "" if at < 0 else id_[at + 1:]


# -- the target's addresses --------------------------------------------------

def _has_scheme(target):
    return target.startswith(_SCHEMES) or "://" in target


def _host_port(item):
    """(host without brackets, port) of "host:port"; ValueError otherwise."""
    host, sep, port = item.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f'server address "{item}" is not host:port (e.g. 127.0.0.1:50051, '
                         f"[::1]:50051, materializer.ml.svc.cluster.local:50051)")
    if len(host) >= 2 and host[0] == "[" and host[-1] == "]":
        host = host[1:-1]
    return host, port


def split_target(target):
    """The items of a target: its comma-separated "host:port" entries, or
    the whole target when it has a gRPC scheme. ValueError for an empty
    target, an empty item or one without a port."""
    target = target.strip()
    if not target:
        raise ValueError("the server address is empty")
    if _has_scheme(target):
        return [target]
    items = []
    for item in target.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f'server address "{target}" has an empty item')
        _host_port(item)
        items.append(item)
    return items


def _is_ip(host):
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def _look_up(host, port):
    """Every address of `host` as "ip:port": its IPv4 ones if it has any
    (so "localhost" is one server: a server listening on 127.0.0.1 does not
    answer on ::1), else its IPv6 ones."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    v4, v6 = [], []
    for family, _, _, _, sockaddr in infos:
        if family == socket.AF_INET:
            v4.append(f"{sockaddr[0]}:{port}")
        elif family == socket.AF_INET6:
            v6.append(f"[{sockaddr[0]}]:{port}")
    chosen = v4 or v6
    if not chosen:
        raise OSError("it has no address")
    return chosen


def resolve_target(target):
    """(endpoints, failures): the distinct (address, tls_name) pairs of the
    target in its order, a host name giving one per address with the name
    as tls_name (the name a TLS certificate is checked against), and one
    message per host name that did not resolve. ValueError: split_target's."""
    endpoints, failures = [], []
    for item in split_target(target):
        if _has_scheme(item):
            found = [(item, "")]
        else:
            host, port = _host_port(item)
            if _is_ip(host):
                found = [(item, "")]
            else:
                try:
                    found = [(a, host) for a in _look_up(host, port)]
                except OSError as e:
                    failures.append(f"cannot look up {host}: {e.strerror or e}")
                    continue
        for endpoint in found:
            if endpoint not in endpoints:
                endpoints.append(endpoint)
    return endpoints, failures


# -- choosing a replica ------------------------------------------------------

def _matches(device, wanted):
    """Whether `device` ("cuda:1") is the device `wanted` asks for, or of
    the kind it names ("cuda")."""
    return device == wanted or (":" not in wanted and device.startswith(wanted + ":"))


def room_for(info, placement):
    """The free bytes `placement` (a Placement) could use on the replica
    whose ServerInfo is `info`, or None when it has no device to use:
    ""/"auto": its largest free device; a kind ("cpu", "cuda"): the largest
    of that kind; a device ("cuda:1"): that one's; "split": the sum over
    split.devices (every device when empty)."""
    wanted = placement.device
    room = None
    if wanted == "split":
        listed = list(placement.split.devices)
        for d in info.devices:
            if not listed or d.device in listed:
                room = (room or 0) + d.free_bytes
        return room
    for d in info.devices:
        if wanted in ("", "auto") or _matches(d.device, wanted):
            room = max(room or 0, d.free_bytes)
    return room


def choose_replica(infos, placement):
    """Index of the ServerInfo with the most room for `placement` (ties: the
    first); 0 when none has a usable device (its answer then says why)."""
    best, best_room = 0, None
    for i, info in enumerate(infos):
        room = room_for(info, placement)
        if room is not None and (best_room is None or room > best_room):
            best, best_room = i, room
    return best


# -- the replicas ------------------------------------------------------------

class Replica:
    """One server: its name ("" for a single server or an unnamed replica),
    the address it is dialed at, and the name its TLS certificate is checked
    against when that is not the address's host. Immutable."""

    def __init__(self, name, address, tls_name=""):
        self.name = name
        self.address = address
        self.tls_name = tls_name

    @property
    def key(self):
        """What channels, stubs and sessions are kept by."""
        return (self.address, self.tls_name)

    def describe(self):
        if not self.name:
            return f"the server at {self.address}"
        return f"replica {self.name} ({self.address})"

    def __repr__(self):
        return f"Replica({self.name!r}, {self.address!r})"


class Discovered:
    """What GetServerInfo at one address said (`replica`, `info`), or why it
    could not be asked (`error`, an RpcError; `replica` None)."""

    def __init__(self, address, replica=None, info=None, error=None):
        self.address = address
        self.replica = replica
        self.info = info
        self.error = error


class ReplicaSet:
    """The servers behind one target. Thread-safe.

    `stub_for(replica)` gives the Materializer stub for a replica (the
    client's, over the client's channels); `metadata()` the identity
    metadata of each call.
    """

    def __init__(self, target, stub_for, metadata, discovery_timeout=DISCOVERY_TIMEOUT_S):
        self.target = target
        self._stub_for = stub_for
        self._metadata = metadata
        self._discovery_timeout = discovery_timeout
        self._lock = threading.Lock()
        # Guarded by _lock:
        self._resolved = False
        self._only = None       # the Replica when the target is one server
        self._by_name = {}      # named replicas met so far (kept when gone)
        self._unnamed = {}      # unnamed replicas, by the address found at

    def _resolve(self):
        """Decides, once, whether the target is one server. A target that
        does not parse or resolve is left to gRPC as one server: its first
        call then fails with gRPC's own words."""
        with self._lock:
            if self._resolved:
                return
        try:
            endpoints, failures = resolve_target(self.target)
            several = len(endpoints) + len(failures) > 1
        except ValueError:
            several = False
        with self._lock:
            if not self._resolved:
                self._resolved = True
                if not several:
                    self._only = Replica("", self.target)

    def single(self):
        """The one server when the target is a single address, else None."""
        self._resolve()
        with self._lock:
            return self._only

    def _adopt(self, info, address, tls_name):
        """The Replica for `info` found at `address`, reusing a known one.
        A named replica is dialed at the address it advertises (it stays
        right when its pod restarts elsewhere), else where it was found."""
        if info.replica and info.advertised_address:
            dial = (info.advertised_address, "")
        else:
            dial = (address, tls_name)
        table = self._by_name if info.replica else self._unnamed
        key = info.replica or address
        with self._lock:
            known = table.get(key)
            if known is not None and known.key == dial:
                return known
            replica = table[key] = Replica(info.replica, *dial)
            return replica

    def discover(self):
        """GetServerInfo at every address of the target now, in parallel:
        one Discovered per address in target order, then one per host name
        that did not resolve. A server without GetServerInfo is an unnamed
        replica. RpcError INVALID_ARGUMENT for a target that does not parse."""
        only = self.single()
        if only is not None:
            endpoints, failures = [(only.address, "")], []
        else:
            try:
                endpoints, failures = resolve_target(self.target)
            except ValueError as e:
                raise RpcError("GetServerInfo", grpc.StatusCode.INVALID_ARGUMENT, str(e),
                               self.target) from None
        found = [None] * len(endpoints)

        def ask(i, address, tls_name):
            probe = only or Replica("", address, tls_name)
            try:
                info = self._stub_for(probe).GetServerInfo(
                    pb.GetServerInfoRequest(), metadata=self._metadata(),
                    timeout=self._discovery_timeout)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                    found[i] = Discovered(address, error=RpcError(
                        "GetServerInfo", e.code(), e.details() or "", address))
                    return
                info = pb.ServerInfo()  # a server from before GetServerInfo
            found[i] = Discovered(address, only or self._adopt(info, address, tls_name), info)

        threads = [threading.Thread(target=ask, args=(i, *e), daemon=True,
                                    name="materializer-discovery")
                   for i, e in enumerate(endpoints)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for failure in failures:
            found.append(Discovered("", error=RpcError(
                "GetServerInfo", grpc.StatusCode.UNAVAILABLE, failure, self.target)))
        return found

    def reachable(self):
        """discover(), each replica once (two addresses of one pod answer
        with one name) sorted by name, then the addresses that did not
        answer."""
        answered, failed = [], []
        for d in self.discover():
            if d.replica is None:
                failed.append(d)
            elif all(a.replica is not d.replica for a in answered):
                answered.append(d)
        answered.sort(key=lambda d: d.replica.name)
        return answered + failed

    def summary(self, found):
        """"r0 at A, r1 at B; C did not answer (why)" for messages."""
        answered, silent = [], []
        for d in found:
            if d.replica is not None:
                answered.append(f"{d.replica.name} at {d.address}" if d.replica.name
                                else f"an unnamed server at {d.address}")
            elif d.address:
                silent.append(f"{d.address} did not answer ({d.error.message})")
            else:
                silent.append(d.error.message)
        text = "found " + ", ".join(answered) if answered else "no replica answered"
        return "; ".join([text, *silent])

    def _refusal(self, found, method):
        """The first refusal of the caller's credentials, if any: then the
        credentials are the problem, not the replicas."""
        for d in found:
            if d.error is not None and d.error.code in _REFUSED_CODES:
                return RpcError(method, d.error.code, d.error.message, d.error.target)
        return None

    def _none_answered(self, found, method):
        return self._refusal(found, method) or RpcError(
            method, grpc.StatusCode.UNAVAILABLE,
            f"no replica at {self.target} answered: {self.summary(found)}", self.target)

    def for_id(self, id_, method):
        """The replicas to ask about a handle or export id: the one server;
        the replica the id names (discovered first when not met yet); or,
        for an id naming none among several replicas, every replica in
        turn. RpcError naming the replica when it is not among those that
        answer: NOT_FOUND when every address answered (it went away, and
        its handles with it), UNAVAILABLE when some did not."""
        only = self.single()
        if only is not None:
            return [only]
        name = replica_of_id(id_)
        if name:
            with self._lock:
                known = self._by_name.get(name)
            if known is not None:
                return [known]
        found = self.reachable()
        candidates = [d.replica for d in found
                      if d.replica is not None and (not name or d.replica.name == name)]
        if candidates:
            return candidates
        refused = self._refusal(found, method)
        if refused is not None:
            raise refused
        if not name:
            raise self._none_answered(found, method)
        why = (f'"{id_}" is held by replica {name}, which is not among the replicas at '
               f"{self.target} ({self.summary(found)})")
        if all(d.replica is not None for d in found):
            raise RpcError(method, grpc.StatusCode.NOT_FOUND,
                           why + ": the replica has gone away, and its handles with it",
                           self.target)
        raise RpcError(method, grpc.StatusCode.UNAVAILABLE,
                       why + ": it may be one that did not answer; try again", self.target)

    def for_placement(self, placement, method, name=None):
        """The replica for a Materialize or Plan with `placement`: the one
        server, or, asked now, the replica with the most room (or the one
        named `name`). RpcError UNAVAILABLE when no address answered (or
        `name` is not among those that did)."""
        only = self.single()
        if only is not None:
            return only
        if name is not None:
            with self._lock:
                known = self._by_name.get(name)
            if known is not None:
                return known
        found = self.reachable()
        answered = [d for d in found if d.replica is not None]
        if name is not None:
            answered = [d for d in answered if d.replica.name == name]
            if not answered:
                raise RpcError(method, grpc.StatusCode.UNAVAILABLE,
                               f"replica {name} is not among the replicas at {self.target} "
                               f"({self.summary(found)})", self.target)
        if not answered:
            raise self._none_answered(found, method)
        return answered[choose_replica([d.info for d in answered], placement)].replica

    def explain(self, replica, error):
        """The error to raise after a call to `replica` failed with `error`
        (an RpcError). An UNAVAILABLE or DEADLINE_EXCEEDED from one of
        several replicas is checked against a fresh discovery: NOT_FOUND
        when every address answered and none is this replica (it is gone),
        else the same code; both name the replica. Others come back as
        they are."""
        if error.code not in _GONE_CODES or self.single() is not None:
            return error
        try:
            found = self.reachable()
        except RpcError:
            found = None
        if found is not None and replica.name:
            present = any(d.replica is not None and d.replica.name == replica.name
                          for d in found)
            if not present and all(d.replica is not None for d in found):
                return RpcError(error.method, grpc.StatusCode.NOT_FOUND,
                                f"{replica.describe()} is gone: it is no longer among the "
                                f"replicas at {self.target} ({self.summary(found)}), and its "
                                f"handles went with it", replica.address)
        return RpcError(error.method, error.code,
                        f"{replica.describe()} did not answer: {error.message}",
                        replica.address)
