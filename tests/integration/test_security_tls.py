"""TLS: a requireTLS cluster (certificates made here with ``cryptography``, none committed)
accepts ``tls=true`` clients that trust the test CA and refuses plain connections; an
allowTLS shard serves both on one port."""

from __future__ import annotations

import datetime
import ipaddress
import socket
from pathlib import Path

import pymongo
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pymongo.errors import ServerSelectionTimeoutError

from shardsim.tools.launcher import Cluster


def make_certs(tmp: Path) -> dict[str, str]:
    """A CA and a server certificate for 127.0.0.1/localhost; PEM paths."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "shardsim test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_path, pem_path = tmp / "ca.pem", tmp / "server.pem"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pem_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption())
                         + cert.public_bytes(serialization.Encoding.PEM))
    return {"ca": str(ca_path), "cert": str(pem_path)}


def test_tls_only_cluster_with_auth(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    with Cluster(shards=2, auth=("root", "pw"), tls=certs) as c:
        with pymongo.MongoClient(c.router_uri, serverSelectionTimeoutMS=10000,
                                 **c.client_options()) as cl:
            cl.admin.command("enableSharding", "t")
            cl.admin.command("shardCollection", "t.c", key={"_id": "hashed"})
            cl.t.c.insert_many([{"_id": i} for i in range(20)])  # both shards, over TLS
            assert cl.t.c.count_documents({}) == 20
        with pymongo.MongoClient(c.router_uri, serverSelectionTimeoutMS=1500) as plain:
            with pytest.raises(ServerSelectionTimeoutError):
                plain.admin.command("ping")
        with pymongo.MongoClient(c.router_uri, tls=True, serverSelectionTimeoutMS=1500) as bad:
            with pytest.raises(ServerSelectionTimeoutError):  # does not trust the server
                bad.admin.command("ping")


def test_allow_tls_serves_both(tmp_path: Path, shard_process) -> None:
    certs = make_certs(tmp_path)
    proc = shard_process("shard0", None, "--tlsMode", "allowTLS", "--tlsCertificateKeyFile",
                         certs["cert"], "--tlsCAFile", certs["ca"])
    uri = f"mongodb://{proc.address}/?directConnection=true"
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=5000) as plain:
        plain.t.c.insert_one({"_id": 1})
    with pymongo.MongoClient(uri, tls=True, tlsCAFile=certs["ca"],
                             serverSelectionTimeoutMS=5000) as tls:
        assert tls.t.c.find_one() == {"_id": 1}
    socket.create_connection((proc.host, proc.port)).close()  # a silent client does no harm
