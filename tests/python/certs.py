"""Certificates for TLS tests, made with openssl in a temporary folder.

    pki = certs.make_pki(tmp_path)
    pki.ca, pki.server_cert, pki.server_key    # server for 127.0.0.1 / localhost
    pki.client("alice")                        # (cert, key) signed by the CA
    pki.client("mallory", ca="other-ca")       # signed by a CA the server
                                               # does not trust
"""

import subprocess


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


class Pki:
    def __init__(self, directory):
        self.dir = directory
        self.ca = directory / "ca.pem"
        self.other_ca = directory / "other-ca.pem"
        self.server_cert = directory / "server.pem"
        self.server_key = directory / "server.key"

    def client(self, name, ca="ca"):
        """A client certificate with CN=name, signed by `ca`; made once."""
        cert = self.dir / f"{name}.pem"
        key = self.dir / f"{name}.key"
        if not cert.exists():
            _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj",
                     f"/CN={name}", "-keyout", key.name, "-out",
                     f"{name}.csr", cwd=self.dir)
            _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem",
                     "-CAkey", f"{ca}.key", "-CAcreateserial", "-days", "2",
                     "-out", cert.name, cwd=self.dir)
        return cert, key


def make_pki(directory):
    """Two CAs and a server certificate for IP 127.0.0.1 and localhost."""
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                 "-subj", f"/CN={ca}", "-keyout", f"{ca}.key",
                 "-out", f"{ca}.pem", cwd=directory)
    (directory / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=server",
             "-keyout", "server.key", "-out", "server.csr", cwd=directory)
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey",
             "ca.key", "-CAcreateserial", "-days", "2", "-extfile",
             "server.ext", "-out", "server.pem", cwd=directory)
    return Pki(directory)
