"""Client layer: typed calls to materializerd over the generated stubs.

    client = Client("127.0.0.1:50051")                  # development mode
    client = Client("host:50051", tls=TLS(root_certificates="ca.pem"),
                    token=open("token").read().strip())  # bearer token
    plan = client.plan(model_spec)
    resp = client.materialize(model_spec)                # bound to the session
    client.release(resp.handle)
    client.close()

    client = Client("10.0.0.5:50051,10.0.0.6:50051")    # replicas (or a headless
                                                        # Service's name)

Knows nothing of torch modules: it takes and returns protocol messages
(materializer.v1). Sessions, identity, deadlines, retries and errors live
here; capture and load sit above it.
"""

from materializer.client.channel import TLS, Connection
from materializer.client.client import Chunk, Client, HandleList, ReplicaResult
from materializer.client.session import Session

__all__ = ["Client", "Chunk", "Connection", "HandleList", "ReplicaResult", "Session", "TLS"]
