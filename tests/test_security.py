"""Listeners, TLS and SASL (issue 17) against the real binary with real clients.

Certificates are made per test session with openssl: a CA, a server certificate for
127.0.0.1/localhost, and a client certificate (O=spate, OU=test, CN=client) for mutual
TLS. Brokers get their security settings from a TOML file, their listeners from
`--listeners`."""

import os
import shutil
import socket
import ssl
import struct
import subprocess
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, ResourceType

from helpers.broker import SPATE_BIN, free_port
from helpers.clients import kcat
from helpers.metrics import metric_sum, scrape
from helpers.wire import api_versions_request, connect, frame, outcome_after, recv_frame, request_header_v1

ALICE = ("alice", "alice-secret")


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_server_cert(d, name="server", days="2"):
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", "/CN=localhost", cwd=d)
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", days, "-extfile", "san.ext", cwd=d)
    return (d / f"{name}.key").read_text() + (d / f"{name}.pem").read_text()


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("certs")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=spate-test-ca", cwd=d)
    (d / "keystore.pem").write_text(make_server_cert(d))
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "client.key", "-out", "client.csr",
            "-subj", "/O=spate/OU=test/CN=client", cwd=d)
    # A v3 certificate (an extension makes it one): webpki refuses v1 certificates.
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    openssl("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "client.pem", "-days", "2", "-extfile", "client.ext", cwd=d)
    return d


def security_config(tmp_path, certs, client_auth="none", extra=""):
    path = tmp_path / "security.toml"
    path.write_text(
        f'ssl_keystore_location = "{certs / "keystore.pem"}"\n'
        f'ssl_truststore_location = "{certs / "ca.pem"}"\n'
        f'ssl_client_auth = "{client_auth}"\n'
        f"{extra}"
        "[sasl_plain_users]\n"
        f'{ALICE[0]} = "{ALICE[1]}"\n'
        'bob = "bob-secret"\n')
    return path


def start_secure(broker_factory, tmp_path, certs, protocols, client_auth="none", extra=""):
    """A broker with a PLAINTEXT listener (its test port) and one listener per protocol
    in `protocols`; returns (broker, {protocol: port}, metrics port)."""
    ports = {p: free_port() for p in protocols}
    metrics_port = free_port()
    plain_port = free_port()
    listeners = ",".join([f"PLAINTEXT://127.0.0.1:{plain_port}"] + [f"{p}://127.0.0.1:{ports[p]}" for p in protocols])
    b = broker_factory("--config", str(security_config(tmp_path, certs, client_auth, extra)),
                       "--listeners", listeners, "--metrics-listen", f"127.0.0.1:{metrics_port}",
                       port=plain_port)
    return b, ports, metrics_port


def sasl_conf(port, certs, mechanism="PLAIN", user=ALICE, protocol="SASL_SSL", **extra):
    c = {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": protocol, "sasl.mechanism": mechanism,
         "sasl.username": user[0], "sasl.password": user[1]}
    if protocol.endswith("SSL"):
        c["ssl.ca.location"] = str(certs / "ca.pem")
    c.update(extra)
    return c


def produce_and_read_back(conf, topic, n=200):
    """Produce n records with confluent-kafka's defaults and read them back in order."""
    p = Producer(conf)
    errors = []
    for i in range(n):
        p.produce(topic, value=f"{topic}-{i}".encode(), key=str(i).encode(),
                  on_delivery=lambda err, msg: errors.append(err) if err else None)
    assert p.flush(60) == 0
    assert errors == []
    c = Consumer(dict(conf, **{"group.id": f"{topic}-g", "auto.offset.reset": "earliest"}))
    c.subscribe([topic])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < n and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            got.append(m.value())
    c.close()
    assert got == [f"{topic}-{i}".encode() for i in range(n)]


def test_sasl_ssl_plain_with_confluent_kafka_kcat_and_kafka_python(broker_factory, tmp_path, certs):
    b, ports, mport = start_secure(broker_factory, tmp_path, certs, ["SASL_SSL"])
    conf = sasl_conf(ports["SASL_SSL"], certs)
    # Metadata answers the address of the listener the client came through.
    md = AdminClient(conf).list_topics(timeout=20)
    assert {(x.id, x.host, x.port) for x in md.brokers.values()} == {(1, "127.0.0.1", ports["SASL_SSL"])}
    produce_and_read_back(conf, "sec-confluent")

    # kcat (librdkafka 2.0.2) over the same listener: produce, then read everything back.
    sec = ["-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanisms=PLAIN", "-X", f"sasl.username={ALICE[0]}",
           "-X", f"sasl.password={ALICE[1]}", "-X", f"ssl.ca.location={certs / 'ca.pem'}"]
    bootstrap = f"127.0.0.1:{ports['SASL_SSL']}"
    r = kcat(bootstrap, *sec, "-P", "-t", "sec-kcat", input=("\n".join(f"k{i}" for i in range(50)) + "\n").encode())
    r = kcat(bootstrap, *sec, "-C", "-t", "sec-kcat", "-e", "-o", "beginning")
    assert r.stdout.decode().split() == [f"k{i}" for i in range(50)]

    # kafka-python with its defaults.
    from kafka import KafkaConsumer, KafkaProducer
    kp_conf = dict(bootstrap_servers=bootstrap, security_protocol="SASL_SSL", sasl_mechanism="PLAIN",
                   sasl_plain_username=ALICE[0], sasl_plain_password=ALICE[1], ssl_cafile=str(certs / "ca.pem"))
    producer = KafkaProducer(**kp_conf)
    for i in range(20):
        producer.send("sec-kafka-python", f"kp{i}".encode())
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer("sec-kafka-python", auto_offset_reset="earliest", consumer_timeout_ms=10000,
                             group_id="kp-g", **kp_conf)
    values = [m.value for m in consumer]
    consumer.close()
    assert values == [f"kp{i}".encode() for i in range(20)]
    assert metric_sum(scrape(mport), "spate_sasl_authentications_total") >= 3
    assert metric_sum(scrape(mport), "spate_sasl_authentication_failures_total") == 0


def test_wrong_passwords_and_unknown_users_are_refused(broker_factory, tmp_path, certs):
    b, ports, mport = start_secure(broker_factory, tmp_path, certs, ["SASL_SSL"])
    for user in [(ALICE[0], "wrong"), ("mallory", "alice-secret"), ("bob", ALICE[1])]:
        admin = AdminClient(sasl_conf(ports["SASL_SSL"], certs, user=user))
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=4)
    assert metric_sum(scrape(mport), "spate_sasl_authentication_failures_total") >= 3
    assert metric_sum(scrape(mport), "spate_sasl_authentications_total") == 0
    # bob's own password works: the refusals were about the passwords.
    AdminClient(sasl_conf(ports["SASL_SSL"], certs, user=("bob", "bob-secret"))).list_topics(timeout=20)


# ------------------------------------------------------------------ raw SASL exchanges

def sasl_handshake(s, mechanism, corr=1):
    m = mechanism.encode()
    s.sendall(frame(request_header_v1(17, 1, corr) + struct.pack(">h", len(m)) + m))
    body = recv_frame(s)
    (got_corr, err, n) = struct.unpack(">ihi", body[:10])
    assert got_corr == corr
    off, mechanisms = 10, []
    for _ in range(n):
        (ln,) = struct.unpack(">h", body[off:off + 2])
        mechanisms.append(body[off + 2:off + 2 + ln].decode())
        off += 2 + ln
    return err, mechanisms


def sasl_authenticate(s, token, corr=2):
    """SaslAuthenticate v1: returns (error code, message, auth bytes, session lifetime ms)."""
    s.sendall(frame(request_header_v1(36, 1, corr) + struct.pack(">i", len(token)) + token))
    body = recv_frame(s)
    (got_corr, err, mlen) = struct.unpack(">ihh", body[:8])
    assert got_corr == corr
    off = 8
    message = None
    if mlen >= 0:
        message = body[off:off + mlen].decode()
        off += mlen
    (blen,) = struct.unpack(">i", body[off:off + 4])
    auth = body[off + 4:off + 4 + blen]
    off += 4 + blen
    (lifetime,) = struct.unpack(">q", body[off:off + 8])
    return err, message, auth, lifetime


def metadata_v0(corr=3):
    return frame(request_header_v1(3, 0, corr) + struct.pack(">i", 0))


def test_only_sasl_is_answered_before_authentication(broker_factory, tmp_path, certs):
    b, ports, mport = start_secure(broker_factory, tmp_path, certs, ["SASL_PLAINTEXT"],
                                   extra="connection_failed_authentication_delay_ms = 700\n")
    port = ports["SASL_PLAINTEXT"]
    # ApiVersions is answered; Metadata before logging in closes the connection unanswered.
    s = connect(port)
    s.sendall(api_versions_request(correlation_id=7))
    assert struct.unpack(">i", recv_frame(s)[:4])[0] == 7
    s.sendall(metadata_v0())
    assert outcome_after(s) == "closed"
    # The same Metadata on the PLAINTEXT listener is answered (the refusal is SASL's).
    s = connect(b.port)
    s.sendall(metadata_v0(corr=9))
    assert struct.unpack(">i", recv_frame(s)[:4])[0] == 9
    # An unauthenticated client cannot make the broker read a large frame.
    s = connect(port)
    s.sendall(struct.pack(">i", 64 << 20) + b"\x00" * 64)
    assert outcome_after(s) == "closed"
    # An unsupported mechanism is refused with the enabled ones listed, and closed.
    s = connect(port)
    err, mechanisms = sasl_handshake(s, "GSSAPI")
    assert (err, mechanisms) == (33, ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
    assert outcome_after(s) == "closed"
    # A wrong password: SASL_AUTHENTICATION_FAILED, only after the configured delay,
    # then the connection is closed.
    s = connect(port)
    assert sasl_handshake(s, "PLAIN")[0] == 0
    started = time.monotonic()
    err, message, _, _ = sasl_authenticate(s, b"\0alice\0wrong")
    assert time.monotonic() - started >= 0.65, "a failed login must be answered only after the delay"
    assert err == 58 and "Invalid username or password" in message
    assert outcome_after(s) == "closed"
    # The right password: authenticated, then Metadata is answered on the connection.
    s = connect(port)
    assert sasl_handshake(s, "PLAIN")[0] == 0
    err, message, _, lifetime = sasl_authenticate(s, b"\0alice\0alice-secret")
    assert (err, lifetime) == (0, 0)
    s.sendall(metadata_v0(corr=11))
    assert struct.unpack(">i", recv_frame(s)[:4])[0] == 11
    # A second SaslAuthenticate without a handshake is out of order: closed.
    s.sendall(frame(request_header_v1(36, 1, 12) + struct.pack(">i", 3) + b"abc"))
    assert outcome_after(s) == "closed"


def test_sessions_expire_and_clients_reauthenticate(broker_factory, tmp_path, certs):
    """connections.max.reauth.ms (KIP-368): librdkafka re-authenticates on its connection
    and keeps producing; a raw client that does not is cut off."""
    b, ports, mport = start_secure(broker_factory, tmp_path, certs, ["SASL_PLAINTEXT"],
                                   extra="connections_max_reauth_ms = 2000\n")
    port = ports["SASL_PLAINTEXT"]
    s = connect(port)
    assert sasl_handshake(s, "PLAIN")[0] == 0
    err, _, _, lifetime = sasl_authenticate(s, b"\0alice\0alice-secret")
    assert (err, lifetime) == (0, 2000)
    s.sendall(metadata_v0(corr=5))
    assert struct.unpack(">i", recv_frame(s)[:4])[0] == 5
    time.sleep(2.5)  # past the session's lifetime, on purpose
    s.sendall(metadata_v0(corr=6))
    assert outcome_after(s) == "closed"

    conf = sasl_conf(port, certs, protocol="SASL_PLAINTEXT")
    p = Producer(conf)
    delivered, errors = [], []
    deadline = time.monotonic() + 7  # three session lifetimes and more
    i = 0
    while time.monotonic() < deadline:
        p.produce("reauth", value=str(i).encode(),
                  on_delivery=lambda err, msg: errors.append(err) if err else delivered.append(msg.offset()))
        p.poll(0.25)
        i += 1
    assert p.flush(30) == 0
    assert errors == []
    assert sorted(delivered) == list(range(i))
    # The first login, the raw one, and at least two re-authentications of the producer.
    assert metric_sum(scrape(mport), "spate_sasl_authentications_total") >= 4


def sasl_handshake_v0(s, mechanism, corr=1):
    """SaslHandshake v0: the same body as v1; what follows it is bare SASL tokens."""
    m = mechanism.encode()
    s.sendall(frame(request_header_v1(17, 0, corr) + struct.pack(">h", len(m)) + m))
    (got_corr, err) = struct.unpack(">ih", recv_frame(s)[:6])
    assert got_corr == corr
    return err


def scram_sha512_exchange(s, user, password, send):
    """RFC 5802 over `send(token) -> server token`; returns whether the server's final
    signature proves it knows the credential."""
    import base64
    import hashlib
    import hmac
    import os
    nonce = base64.b64encode(os.urandom(18)).decode()
    bare = f"n={user},r={nonce}"
    server_first = send(f"n,,{bare}".encode()).decode()
    attrs = dict(kv.split("=", 1) for kv in server_first.split(","))
    assert attrs["r"].startswith(nonce) and len(attrs["r"]) > len(nonce)
    salted = hashlib.pbkdf2_hmac("sha512", password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
    mac = lambda key, msg: hmac.new(key, msg, hashlib.sha512).digest()  # noqa: E731
    client_key = mac(salted, b"Client Key")
    without_proof = f"c=biws,r={attrs['r']}"
    auth_message = f"{bare},{server_first},{without_proof}".encode()
    signature = mac(hashlib.sha512(client_key).digest(), auth_message)
    proof = bytes(a ^ b for a, b in zip(client_key, signature))
    server_final = send(f"{without_proof},p={base64.b64encode(proof).decode()}".encode()).decode()
    want = base64.b64encode(mac(mac(salted, b"Server Key"), auth_message)).decode()
    return server_final == f"v={want}"


def test_sasl_handshake_v0_takes_bare_tokens(broker_factory, tmp_path, certs):
    """SaslHandshake v0, which kafka-python up to 2.0.2, Sarama up to 1.40 and aiokafka
    send: the tokens follow as size-prefixed frames without a Kafka header, PLAIN's
    success is an empty token, and a failed login closes the connection (after the
    delay) with nothing sent."""
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion
    b, ports, mport = start_secure(broker_factory, tmp_path, certs, ["SASL_PLAINTEXT"],
                                   extra="connection_failed_authentication_delay_ms = 700\n")
    port = ports["SASL_PLAINTEXT"]
    # PLAIN: an empty token back, then requests are answered on the connection.
    s = connect(port)
    assert sasl_handshake_v0(s, "PLAIN") == 0
    s.sendall(frame(b"\0alice\0alice-secret"))
    assert recv_frame(s) == b""
    s.sendall(metadata_v0(corr=21))
    assert struct.unpack(">i", recv_frame(s)[:4])[0] == 21
    # Re-authentication needs v1 (KIP-368): a second v0 handshake closes the connection.
    s.sendall(frame(request_header_v1(17, 0, 22) + struct.pack(">h", 5) + b"PLAIN"))
    assert outcome_after(s) == "closed"
    # A wrong password: nothing is sent back, and the connection closes after the delay.
    s = connect(port)
    assert sasl_handshake_v0(s, "PLAIN") == 0
    started = time.monotonic()
    s.sendall(frame(b"\0alice\0wrong"))
    assert outcome_after(s) == "closed"
    assert time.monotonic() - started >= 0.65, "a failed login must close only after the delay"
    # SCRAM-SHA-512 against a credential set through the admin API: two rounds of bare
    # tokens, and the server's signature checks out.
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    upsert = UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
                                          b"carol-pw")
    for f in admin.alter_user_scram_credentials([upsert]).values():
        f.result(30)

    def bare_round(token):
        s.sendall(frame(token))
        return recv_frame(s)

    s = connect(port)
    assert sasl_handshake_v0(s, "SCRAM-SHA-512") == 0
    deadline = time.monotonic() + 20
    while True:  # the credential reaches the shard's view a moment after the answer
        try:
            assert scram_sha512_exchange(s, "carol", "carol-pw", bare_round)
            break
        except (ConnectionError, struct.error, AssertionError, socket.timeout):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
            s = connect(port)
            assert sasl_handshake_v0(s, "SCRAM-SHA-512") == 0
    s.sendall(metadata_v0(corr=23))
    assert struct.unpack(">i", recv_frame(s)[:4])[0] == 23
    # A wrong SCRAM password: the client-final is refused by closing the connection.
    s = connect(port)
    assert sasl_handshake_v0(s, "SCRAM-SHA-512") == 0
    with pytest.raises((ConnectionError, struct.error, socket.timeout)):
        scram_sha512_exchange(s, "carol", "wrong", bare_round)
    assert metric_sum(scrape(mport), "spate_sasl_authentications_total") >= 2
    assert metric_sum(scrape(mport), "spate_sasl_authentication_failures_total") >= 2


# ------------------------------------------------------------------------ TLS

def peer_certificate_serial(port, certs):
    ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            return s.getpeercert()["serialNumber"]


def test_mutual_tls_requires_a_client_certificate(broker_factory, tmp_path, certs):
    b, ports, mport = start_secure(broker_factory, tmp_path, certs, ["SSL"], client_auth="required")
    base = {"bootstrap.servers": f"127.0.0.1:{ports['SSL']}", "security.protocol": "SSL",
            "ssl.ca.location": str(certs / "ca.pem")}
    with pytest.raises(KafkaException):
        AdminClient(base).list_topics(timeout=5)
    assert metric_sum(scrape(mport), "spate_tls_handshake_failures_total") >= 1
    # A certificate from another CA is refused too.
    other = tmp_path / "other"
    other.mkdir()
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "o.key", "-out", "o.pem", "-days", "2",
            "-subj", "/CN=intruder", cwd=other)
    with pytest.raises(KafkaException):
        AdminClient(dict(base, **{"ssl.certificate.location": str(other / "o.pem"),
                                  "ssl.key.location": str(other / "o.key")})).list_topics(timeout=5)
    with_cert = dict(base, **{"ssl.certificate.location": str(certs / "client.pem"),
                              "ssl.key.location": str(certs / "client.key")})
    produce_and_read_back(with_cert, "mtls")


def test_encrypted_private_keys_open_with_ssl_key_password(broker_factory, tmp_path, certs):
    """ssl.key.password: the broker's keystore holds its key as encrypted PKCS#8, as
    `openssl pkcs8 -topk8` writes it (PBES2, AES-256-CBC, PBKDF2); clients connect over
    mutual TLS. The CLI presents a client key encrypted with scrypt, opened with
    ssl.key.password from its --command-config. A missing or wrong password stops the
    broker at start, and the CLI, with a message that says so."""
    own = tmp_path / "enc-certs"
    shutil.copytree(certs, own)
    openssl("pkcs8", "-topk8", "-v2", "aes-256-cbc", "-in", "server.key", "-out", "server.enc.key",
            "-passout", "pass:ks-pass", cwd=own)
    openssl("pkcs8", "-topk8", "-scrypt", "-in", "client.key", "-out", "client.enc.key",
            "-passout", "pass:cl-pass", cwd=own)
    assert "ENCRYPTED PRIVATE KEY" in (own / "server.enc.key").read_text()
    (own / "keystore.pem").write_text((own / "server.enc.key").read_text() + (own / "server.pem").read_text())
    (own / "client-keystore.pem").write_text((own / "client.enc.key").read_text() + (own / "client.pem").read_text())

    b, ports, _ = start_secure(broker_factory, tmp_path, own, ["SSL"], client_auth="required",
                               extra='ssl_key_password = "ks-pass"\n')
    port = ports["SSL"]
    with_cert = {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SSL",
                 "ssl.ca.location": str(own / "ca.pem"), "ssl.certificate.location": str(own / "client.pem"),
                 "ssl.key.location": str(own / "client.key")}
    produce_and_read_back(with_cert, "encrypted-key", n=50)

    spate = str(SPATE_BIN)
    props = tmp_path / "client.properties"
    client_props = ("security.protocol=SSL\nssl.truststore.type=PEM\n"
                    f"ssl.truststore.location={own / 'ca.pem'}\n"
                    f"ssl.keystore.type=PEM\nssl.keystore.location={own / 'client-keystore.pem'}\n")
    props.write_text(client_props + "ssl.key.password=cl-pass\n")
    cli = [spate, "topic", "list", "--bootstrap", f"127.0.0.1:{port}", "--command-config", str(props)]
    r = subprocess.run(cli, capture_output=True, timeout=60)
    assert r.returncode == 0 and b"encrypted-key" in r.stdout, r
    props.write_text(client_props)
    r = subprocess.run(cli, capture_output=True, timeout=60)
    assert r.returncode != 0 and b"set ssl.key.password" in r.stderr, r
    props.write_text(client_props + "ssl.key.password=wrong\n")
    r = subprocess.run(cli, capture_output=True, timeout=60)
    assert r.returncode != 0 and b"wrong ssl.key.password" in r.stderr, r

    # The broker itself, with a wrong and without a password: it does not start.
    for extra, says in (('ssl_key_password = "wrong"\n', b"wrong ssl.key.password"), ("", b"set ssl.key.password")):
        cfg = security_config(tmp_path, own, extra=extra)
        r = subprocess.run([spate, "serve", "--data-dir", str(tmp_path / "refused"), "--config", str(cfg),
                            "--listeners", f"SSL://127.0.0.1:{free_port()}"], capture_output=True, timeout=60)
        out = r.stdout + r.stderr
        assert r.returncode != 0 and says in out and b"keystore.pem" in out, r


def test_certificates_are_reloaded_without_a_restart(broker_factory, tmp_path, certs):
    own = tmp_path / "own-certs"
    shutil.copytree(certs, own)
    b, ports, mport = start_secure(broker_factory, tmp_path, own, ["SSL"])
    before = peer_certificate_serial(ports["SSL"], own)
    (own / "keystore.pem").write_text(make_server_cert(own, name="renewed"))
    deadline = time.monotonic() + 30
    seen = before
    while seen == before and time.monotonic() < deadline:
        time.sleep(0.5)
        seen = peer_certificate_serial(ports["SSL"], own)
    assert seen != before, "the renewed certificate was not served within 30 s"
    # A keystore that no longer parses keeps the renewed one in service.
    (own / "keystore.pem").write_text("garbage\n")
    time.sleep(6)  # past one reload check (5 s), on purpose: nothing may change
    assert peer_certificate_serial(ports["SSL"], own) == seen
    assert b.alive()


def test_a_kafka_server_properties_file_configures_listeners_and_sasl(broker_factory, tmp_path, certs):
    """`spate serve --config server.properties`: Kafka's names for listeners, TLS and
    SASL (PLAIN users from the listener's JAAS config)."""
    plain, sasl_ssl = free_port(), free_port()
    props = tmp_path / "server.properties"
    props.write_text(
        "# as an operator would bring it from Kafka\n"
        "node.id=1\n"
        "process.roles=broker,controller\n"
        f"listeners=PLAINTEXT://127.0.0.1:{plain},SASL_SSL://127.0.0.1:{sasl_ssl}\n"
        "num.network.threads=3\n"
        "sasl.kerberos.service.name=kafka\n"
        "my.plugin.setting=7\n"
        "ssl.keystore.type=PEM\n"
        f"ssl.keystore.location={certs / 'keystore.pem'}\n"
        "sasl.enabled.mechanisms=PLAIN\n"
        "listener.name.sasl_ssl.plain.sasl.jaas.config="
        "org.apache.kafka.common.security.plain.PlainLoginModule required \\\n"
        '    username="admin" password="admin-secret" user_admin="admin-secret" user_carol="carol-pw";\n')
    b = broker_factory("--config", str(props), port=plain)
    produce_and_read_back(sasl_conf(sasl_ssl, certs, user=("carol", "carol-pw")), "from-properties", n=20)
    with pytest.raises(KafkaException):
        AdminClient(sasl_conf(sasl_ssl, certs, user=("carol", "wrong"))).list_topics(timeout=4)
    log = b.log_path.read_text()
    assert ("settings Spate does not act on (kept and described): process.roles, num.network.threads, "
            "sasl.kerberos.service.name, my.plugin.setting") in log
    # Described as Kafka 4.4 describes its file: every Kafka config with its value, the
    # passwords (the JAAS config) and names Kafka does not define without theirs.
    r = ConfigResource(ResourceType.BROKER, "1")
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    described = admin.describe_configs([r])[r].result(timeout=15)
    seen = {n: (e.value, e.source, e.is_sensitive) for n, e in described.items()}
    static = ConfigSource.STATIC_BROKER_CONFIG.value
    assert seen["num.network.threads"] == ("3", static, False)
    assert seen["sasl.kerberos.service.name"] == ("kafka", static, False)
    assert seen["my.plugin.setting"] == (None, static, True)
    assert seen["listener.name.sasl_ssl.plain.sasl.jaas.config"] == (None, static, True)
    assert seen["process.roles"] == ("broker,controller", static, False)
    # Kafka's default last among the synonyms, where it has one (confluent-kafka keeps
    # one synonym per name: the last).
    synonym = described["num.network.threads"].synonyms["num.network.threads"]
    assert (synonym.value, synonym.source) == ("3", ConfigSource.DEFAULT_CONFIG.value)
    assert described["log.dirs"].synonyms["log.dirs"].source == static


def produce_one(conf, topic, timeout=20):
    """Produce one record; the delivery error's code (None when delivered)."""
    p = Producer(dict(conf, **{"message.timeout.ms": timeout * 1000}))
    result = []
    p.produce(topic, b"v-" + topic.encode(), on_delivery=lambda err, msg: result.append(err))
    assert p.flush(timeout + 5) == 0, "no delivery report"
    return None if result[0] is None else result[0].code()


def test_acls_apply_to_sasl_users_and_certificate_subjects(broker_factory, tmp_path, certs):
    """Three principals on one broker: the SASL super user bob, the SASL user alice
    and the mutual-TLS client `CN=client,OU=test,O=spate`; each may write exactly what its
    ACLs say, and ANONYMOUS on the PLAINTEXT listener nothing."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, NewTopic,
                                       ResourcePatternType, ResourceType)
    extra = ('authorizer_class_name = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"\n'
             'super_users = "User:bob"\n')
    b, ports, mport = start_secure(broker_factory, tmp_path, certs, ["SASL_PLAINTEXT", "SSL"],
                                   client_auth="requested", extra=extra)
    admin_conf = sasl_conf(ports["SASL_PLAINTEXT"], certs, user=("bob", "bob-secret"), protocol="SASL_PLAINTEXT")
    alice_conf = sasl_conf(ports["SASL_PLAINTEXT"], certs, protocol="SASL_PLAINTEXT")
    cert_conf = {"bootstrap.servers": f"127.0.0.1:{ports['SSL']}", "security.protocol": "SSL",
                 "ssl.ca.location": str(certs / "ca.pem"), "ssl.certificate.location": str(certs / "client.pem"),
                 "ssl.key.location": str(certs / "client.key")}
    anon_conf = {"bootstrap.servers": b.bootstrap}
    admin = AdminClient(admin_conf)
    for f in admin.create_topics([NewTopic(t, 1) for t in ("alice-t", "cert-t")]).values():
        f.result(30)
    bindings = [
        AclBinding(ResourceType.TOPIC, "alice-t", ResourcePatternType.LITERAL, "User:alice", "*",
                   AclOperation.WRITE, AclPermissionType.ALLOW),
        AclBinding(ResourceType.TOPIC, "cert-t", ResourcePatternType.LITERAL, "User:CN=client,OU=test,O=spate", "*",
                   AclOperation.WRITE, AclPermissionType.ALLOW),
        # Everyone may see both topics, so the refusals below come from Produce itself.
        AclBinding(ResourceType.TOPIC, "*", ResourcePatternType.LITERAL, "User:*", "*",
                   AclOperation.DESCRIBE, AclPermissionType.ALLOW),
    ]
    for f in admin.create_acls(bindings).values():
        f.result(30)
    denied = KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert produce_one(alice_conf, "alice-t") is None
    assert produce_one(alice_conf, "cert-t") == denied
    assert produce_one(cert_conf, "cert-t") is None
    assert produce_one(cert_conf, "alice-t") == denied
    assert produce_one(anon_conf, "alice-t") == denied
    # alice may not create ACLs (ALTER on the cluster); the super user may, as above.
    alice_admin = AdminClient(alice_conf)
    fut = alice_admin.create_acls([bindings[0]])[bindings[0]]
    with pytest.raises(KafkaException) as e:
        fut.result(30)
    assert e.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # What was accepted is there, once each: read back as the super user.
    for topic in ("alice-t", "cert-t"):
        c = Consumer(dict(admin_conf, **{"group.id": f"check-{topic}", "auto.offset.reset": "earliest"}))
        c.subscribe([topic])
        got, deadline = [], time.monotonic() + 30
        while time.monotonic() < deadline and not got:
            m = c.poll(1.0)
            if m is not None and m.error() is None:
                got.append(m.value())
        time.sleep(1)  # on purpose: a second record must not come
        m = c.poll(0.5)
        c.close()
        assert got == [b"v-" + topic.encode()] and (m is None or m.error() is not None)
    log = b.log_path.read_text()
    assert "Principal = User:CN=client,OU=test,O=spate is Denied Operation = Write" in log
    assert "Principal = User:alice is Denied Operation = Write" in log


def test_principal_mapping_rules_name_certificate_principals(broker_factory, tmp_path, certs):
    """ssl.principal.mapping.rules (KIP-371): the client certificate `CN=client,OU=test,
    O=spate` becomes `User:CLIENT` under `RULE:^CN=(.*?),OU=test.*$/$1/U`, which is what
    ACLs and the authorizer's log name; a certificate no rule matches is refused."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, NewTopic, ResourcePatternType
    from confluent_kafka.admin import ResourceType
    extra = ('authorizer_class_name = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"\n'
             'super_users = "User:ANONYMOUS"\n'
             'ssl_principal_mapping_rules = "RULE:^CN=(.*?),OU=other.*$/$1/, RULE:^CN=(.*?),OU=test.*$/$1/U"\n')
    b, ports, _ = start_secure(broker_factory, tmp_path, certs, ["SSL"], client_auth="required", extra=extra)
    cert_conf = {"bootstrap.servers": f"127.0.0.1:{ports['SSL']}", "security.protocol": "SSL",
                 "ssl.ca.location": str(certs / "ca.pem"), "ssl.certificate.location": str(certs / "client.pem"),
                 "ssl.key.location": str(certs / "client.key")}
    admin = AdminClient({"bootstrap.servers": b.bootstrap})  # ANONYMOUS on PLAINTEXT: a super user here
    for f in admin.create_topics([NewTopic(t, 1) for t in ("mapped-t", "unmapped-t")]).values():
        f.result(30)
    bindings = [AclBinding(ResourceType.TOPIC, t, ResourcePatternType.LITERAL, principal, "*", op,
                           AclPermissionType.ALLOW)
                for t, principal, op in [("mapped-t", "User:CLIENT", AclOperation.WRITE),
                                         ("unmapped-t", "User:CN=client,OU=test,O=spate", AclOperation.WRITE),
                                         ("*", "User:*", AclOperation.DESCRIBE)]]
    for f in admin.create_acls(bindings).values():
        f.result(30)
    assert produce_one(cert_conf, "mapped-t") is None
    # The unmapped subject is no longer the principal: its ACL does not apply.
    assert produce_one(cert_conf, "unmapped-t") == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "User:CLIENT" in b.log_path.read_text(errors="replace")

    # A broker whose rules match no subject of this CA refuses the certificate.
    extra = 'ssl_principal_mapping_rules = "RULE:^CN=(.*?),OU=other.*$/$1/"\n'
    tmp2 = tmp_path / "second"
    tmp2.mkdir()
    b2, ports2, mport2 = start_secure(broker_factory, tmp2, certs, ["SSL"], client_auth="required", extra=extra)
    with pytest.raises(KafkaException):
        AdminClient(dict(cert_conf, **{"bootstrap.servers": f"127.0.0.1:{ports2['SSL']}"})).list_topics(timeout=4)
    assert "no ssl.principal.mapping.rules rule matches" in b2.log_path.read_text(errors="replace")
    assert metric_sum(scrape(mport2), "spate_tls_certificates_unmapped_total") >= 1
    assert metric_sum(scrape(mport2), "spate_tls_handshake_failures_total") == 0  # the handshake itself succeeded


def test_scram_logins_use_credentials_set_through_the_admin_api(broker_factory, tmp_path, certs):
    """SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802/7677): credentials set with
    AlterUserScramCredentials (confluent-kafka's admin) are what logins check against."""
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion
    b, ports, mport = start_secure(broker_factory, tmp_path, certs, ["SASL_SSL"])
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    upserts = [
        UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"carol-pw"),
        UserScramCredentialUpsertion("dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"dave-pw"),
    ]
    for f in admin.alter_user_scram_credentials(upserts).values():
        f.result(30)
    port = ports["SASL_SSL"]
    produce_and_read_back(sasl_conf(port, certs, mechanism="SCRAM-SHA-512", user=("carol", "carol-pw")), "scram512")
    produce_and_read_back(sasl_conf(port, certs, mechanism="SCRAM-SHA-256", user=("dave", "dave-pw")), "scram256",
                          n=50)
    # kafka-python's SCRAM client against the same credential.
    from kafka import KafkaProducer
    producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", security_protocol="SASL_SSL",
                             sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="carol",
                             sasl_plain_password="carol-pw", ssl_cafile=str(certs / "ca.pem"))
    producer.send("scram-kp", b"x").get(timeout=30)
    producer.close()
    before = metric_sum(scrape(mport), "spate_sasl_authentication_failures_total")
    for mech, user in [("SCRAM-SHA-512", ("carol", "wrong")), ("SCRAM-SHA-256", ("carol", "carol-pw")),
                       ("SCRAM-SHA-512", ("nobody", "x")), ("SCRAM-SHA-512", ALICE)]:
        # A wrong password, a mechanism the user has no credential for, an unknown user,
        # and a PLAIN user (PLAIN's passwords are not SCRAM credentials).
        with pytest.raises(KafkaException):
            AdminClient(sasl_conf(port, certs, mechanism=mech, user=user)).list_topics(timeout=4)
    assert metric_sum(scrape(mport), "spate_sasl_authentication_failures_total") >= before + 4
