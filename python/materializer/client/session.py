"""The session lease: one Attach stream per target, held by a thread.

Handles created with the session's id in the call metadata live as long as
the session: when this process ends, however it ends (exit, crash, SIGKILL,
Ctrl-C), the stream ends with it and the server releases them after its
grace period. While the process lives, a broken stream (the server
restarted its listener, a network blip) is resumed with the resume token
within the grace period, keeping the handles.
"""

import logging
import threading
import time

import grpc

from materializer._proto import pb
from materializer.errors import RpcError

log = logging.getLogger("materializer")
SESSION_KEY = "x-materializer-session"


# How much longer a resume waits for the server to notice a broken stream
# it still counts as attached.
ATTACHED_WAIT_S = 30.0

class Session:
    """An open Attach stream. Thread-safe; `id` is stable for its life
    (a resumed stream keeps the id)."""

    def __init__(self, stub, metadata, target, open_timeout=30.0):
        self._stub = stub
        self._metadata = metadata
        self.target = target
        self._open_timeout = open_timeout
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._call = None     # current stream; guarded by _lock
        self._ended = None    # Event set when the current stream's reader ends
        self.id = None
        self.resume_token = ""
        self.grace_s = 0.0
        self.lost = None      # why the session is gone, if it is
        self._start(resume_token="")
        self._watcher = threading.Thread(target=self._watch, daemon=True,
                                         name="materializer-session")
        self._watcher.start()

    def _start(self, resume_token):
        stop = threading.Event()

        def requests():
            yield pb.AttachRequest(resume_token=resume_token)
            # Heartbeats are not needed: gRPC keepalive pings the connection.
            stop.wait()

        call = self._stub.Attach(requests(), metadata=self._metadata,
                                 wait_for_ready=True)
        try:
            first = _first_response(call, self._open_timeout)
        except grpc.RpcError as e:
            stop.set()
            raise RpcError("Attach", e.code(), e.details(), self.target) from None
        ended = threading.Event()

        def drain():
            try:
                for _ in call:
                    pass
            except grpc.RpcError:
                pass
            finally:
                ended.set()

        threading.Thread(target=drain, daemon=True,
                         name="materializer-attach").start()
        with self._lock:
            self._call, self._stop, self._ended = call, stop, ended
            self.id = first.session_id
            if first.resume_token:
                self.resume_token = first.resume_token
            self.grace_s = first.grace.seconds + first.grace.nanos / 1e9
        return first

    def _watch(self):
        """Resumes the session when its stream ends while we still want it."""
        while not self._closing.is_set():
            with self._lock:
                ended = self._ended
            ended.wait()
            if self._closing.is_set():
                return
            deadline = time.monotonic() + max(self.grace_s, 1.0)
            # While the server still counts the old stream as attached
            # (ALREADY_EXISTS: it has not seen the cut yet) the session
            # cannot expire, so that wait gets longer.
            attached_deadline = deadline + ATTACHED_WAIT_S
            delay = 0.05
            while not self._closing.is_set():
                try:
                    first = self._start(self.resume_token)
                    if not first.resumed:
                        self.lost = ("the server did not resume the session "
                                     "(its handles were released)")
                        log.warning("materializer session %s: %s", self.id, self.lost)
                    break
                except RpcError as e:
                    limit = (attached_deadline if e.code == grpc.StatusCode.ALREADY_EXISTS
                             else deadline)
                    if time.monotonic() > limit or e.code in (
                            grpc.StatusCode.NOT_FOUND,
                            grpc.StatusCode.UNAUTHENTICATED,
                            grpc.StatusCode.PERMISSION_DENIED):
                        self.lost = f"could not resume the session: {e}"
                        log.warning("materializer session %s: %s", self.id, self.lost)
                        return
                    time.sleep(delay)
                    delay = min(delay * 2, 1.0)

    def metadata(self):
        return ((SESSION_KEY, self.id),)

    def close(self):
        """Ends the stream cleanly; the server releases the session's
        handles after its grace period unless another stream resumes it."""
        self._closing.set()
        with self._lock:
            stop, ended, call = self._stop, self._ended, self._call
        stop.set()
        if not ended.wait(5.0):
            call.cancel()


def _first_response(call, timeout):
    """The stream's first message, or the stream's error, within timeout."""
    box = {}
    done = threading.Event()

    def read():
        try:
            box["value"] = next(call)
        except StopIteration:
            box["error"] = None
        except grpc.RpcError as e:
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=read, daemon=True).start()
    if not done.wait(timeout):
        call.cancel()
        done.wait(5.0)
        raise RpcError("Attach", grpc.StatusCode.DEADLINE_EXCEEDED,
                       f"no answer to Attach within {timeout:g} s")
    if "value" in box:
        return box["value"]
    if box.get("error") is not None:
        raise box["error"]
    raise RpcError("Attach", grpc.StatusCode.UNAVAILABLE,
                   "the Attach stream ended before its first answer")
