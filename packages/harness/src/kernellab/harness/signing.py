"""Ed25519 signatures of reports: who made a report, not only that it is unchanged.

The sha256 of a report shows an edit, but anyone can re-seal an edited report. A signature can only
be made with the private key; a verifier that trusts the matching public key knows the report came,
unedited, from its holder. The signature covers the canonical JSON without ``sha256`` and without
itself; the report is sealed after signing, so its sha256 covers the signature too.

Needs the ``cryptography`` package: ``pip install 'kernellab-harness[sign]'``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from . import report as report_io

SIGNATURE_FIELD = "signature"
ALGORITHM = "ed25519"
PUBLIC_KEY_SUFFIXES = (".pem", ".pub")


class SigningError(ValueError):
    """A key that cannot be used, or a signature that does not verify."""


def _ed25519():
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise SigningError("report signing needs the 'cryptography' package: "
                           "pip install 'kernellab-harness[sign]'") from None
    return ed25519


def _serialization():
    _ed25519()
    from cryptography.hazmat.primitives import serialization

    return serialization


def signed_bytes(report: dict) -> bytes:
    """What a signature covers: the canonical JSON without the hash and the signature."""
    body = {k: v for k, v in report.items() if k != SIGNATURE_FIELD}
    return report_io.canonical_json(body, report_io.HASH_FIELD)


def raw_public_key(public_key) -> bytes:
    s = _serialization()
    return public_key.public_bytes(s.Encoding.Raw, s.PublicFormat.Raw)


def key_id(raw: bytes) -> str:
    """The first 16 hex digits of the sha256 of the raw 32-byte public key."""
    return hashlib.sha256(raw).hexdigest()[:16]


def generate_keypair(path: str | os.PathLike) -> tuple[Path, Path]:
    """A new key pair: the private key at ``path`` (PEM, mode 0600), the public key at ``path``.pub."""
    ed25519, s = _ed25519(), _serialization()
    private_path = Path(path)
    public_path = private_path.with_name(private_path.name + ".pub")
    for p in (private_path, public_path):
        if p.exists():
            raise SigningError(f"key file {p} exists already; not overwriting it")
    key = ed25519.Ed25519PrivateKey.generate()
    private_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption()))
    public_path.write_bytes(key.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo))
    return private_path, public_path


def load_private_key(path: str | os.PathLike):
    """An unencrypted Ed25519 private key from a PEM file, or a SigningError saying what is wrong."""
    ed25519, s = _ed25519(), _serialization()
    path = Path(path)
    try:
        key = s.load_pem_private_key(path.read_bytes(), password=None)
    except FileNotFoundError:
        raise SigningError(f"signing key {path} does not exist") from None
    except (ValueError, TypeError) as e:
        raise SigningError(f"signing key {path} is not an unencrypted PEM private key: {e}") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise SigningError(f"signing key {path} is a {type(key).__name__}, expected an Ed25519 private key")
    return key


def _load_public_key(path: Path):
    ed25519, s = _ed25519(), _serialization()
    try:
        key = s.load_pem_public_key(path.read_bytes())
    except (ValueError, TypeError) as e:
        raise SigningError(f"trusted key {path} is not a PEM public key: {e}") from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise SigningError(f"trusted key {path} is a {type(key).__name__}, expected an Ed25519 public key")
    return key


def load_trusted(path: str | os.PathLike) -> dict[str, object]:
    """Trusted public keys by key id: one PEM file, or every ``*.pem``/``*.pub`` file of a directory."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in PUBLIC_KEY_SUFFIXES)
        if not files:
            raise SigningError(f"trusted key directory {path} holds no {' or '.join(PUBLIC_KEY_SUFFIXES)} files")
    elif path.is_file():
        files = [path]
    else:
        raise SigningError(f"trusted keys {path} is neither a PEM file nor a directory of them")
    keys = {}
    for f in files:
        key = _load_public_key(f)
        keys[key_id(raw_public_key(key))] = key
    return keys


def sign(report: dict, private_key) -> dict:
    """A copy of ``report`` with its signature, sealed again (the sha256 covers the signature)."""
    raw = raw_public_key(private_key.public_key())
    body = {k: v for k, v in report_io.clean(report).items() if k not in (report_io.HASH_FIELD, SIGNATURE_FIELD)}
    body[SIGNATURE_FIELD] = {
        "algorithm": ALGORITHM,
        "public_key": raw.hex(),
        "key_id": key_id(raw),
        "value": private_key.sign(signed_bytes(body)).hex(),
    }
    return report_io.seal(body)


def signer(report: dict) -> str | None:
    """The key id a report says signed it, or None where it is unsigned (not verified: see ``verify``)."""
    sig = report.get(SIGNATURE_FIELD)
    return sig.get("key_id") if isinstance(sig, dict) else None


def verify(report: dict, trusted: dict[str, object]) -> str:
    """The key id of the trusted key whose signature the report carries; a SigningError where the report
    is unsigned, signed by a key not trusted, or its signature does not match its content."""
    _ed25519()
    from cryptography.exceptions import InvalidSignature

    sig = report.get(SIGNATURE_FIELD)
    if sig is None:
        raise SigningError("the report is unsigned and trusted keys were given")
    if not isinstance(sig, dict) or sig.get("algorithm") != ALGORITHM:
        raise SigningError(f"the report's signature is not an {ALGORITHM} signature record: {sig!r:.120}")
    kid = sig.get("key_id")
    key = trusted.get(kid)
    if key is None:
        raise SigningError(f"the report is signed by key {kid!r}, which is not among the trusted keys "
                           f"{sorted(trusted)}")
    if sig.get("public_key") != raw_public_key(key).hex():
        raise SigningError(f"the report's public key is not trusted key {kid}'s, though it names that key id")
    try:
        key.verify(bytes.fromhex(sig.get("value", "")), signed_bytes(report))
    except (InvalidSignature, ValueError, TypeError):
        raise SigningError(f"the report's signature by key {kid} does not match its content: "
                           "it was changed after it was signed") from None
    return kid
