"""Signed reports: a round trip, and each way a signature must fail (tampered and resealed, unknown
key, unsigned where keys are trusted, a key swapped in), plus the CLI that signs what it writes."""

import copy
import json
import stat
import sys

import pytest
import synthetic

from kernellab.harness import consistency, signing
from kernellab.harness import report as report_io

pytest.importorskip("cryptography", reason="signing needs the 'sign' extra (cryptography)")


@pytest.fixture
def keys(tmp_path):
    private, public = signing.generate_keypair(tmp_path / "keys" / "lab")
    return signing.load_private_key(private), public


def test_keygen_writes_a_private_key_only_its_owner_reads(tmp_path):
    private, public = signing.generate_keypair(tmp_path / "k")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert public.name == "k.pub" and b"BEGIN PUBLIC KEY" in public.read_bytes()
    assert b"BEGIN PRIVATE KEY" in private.read_bytes()
    with pytest.raises(signing.SigningError, match="exists already"):
        signing.generate_keypair(tmp_path / "k")


def test_round_trip(keys):
    key, public = keys
    report = synthetic.run_report()
    signed = signing.sign(report, key)
    sig = signed["signature"]
    assert sig["algorithm"] == "ed25519" and len(bytes.fromhex(sig["public_key"])) == 32
    assert sig["key_id"] == signing.key_id(bytes.fromhex(sig["public_key"])) and len(sig["key_id"]) == 16
    assert signed["sha256"] == report_io.report_hash(signed) != report["sha256"]  # sealed after signing
    trusted = signing.load_trusted(public)
    assert signing.verify(signed, trusted) == sig["key_id"]
    assert signing.signer(signed) == sig["key_id"] and signing.signer(report) is None
    assert consistency.check(signed) == []


def test_a_signed_report_written_and_loaded(keys, tmp_path):
    key, public = keys
    path = report_io.write(signing.sign(synthetic.run_report(), key), tmp_path / "r.json")
    loaded = report_io.load(path)  # the hash covers the signature: load keeps working
    assert signing.verify(loaded, signing.load_trusted(public.parent))


def test_tampered_and_resealed_fails(keys):
    key, public = keys
    signed = signing.sign(synthetic.run_report(), key)
    forged = copy.deepcopy(signed)
    forged["cases"][1]["modes"]["e2e_throughput"]["summary_us"]["p50"] /= 50
    forged["sha256"] = report_io.report_hash(forged)
    report_io.check_shape(forged)
    with pytest.raises(signing.SigningError, match="does not match its content"):
        signing.verify(forged, signing.load_trusted(public))


def test_unknown_key_fails(keys, tmp_path):
    key, _ = keys
    _, other_public = signing.generate_keypair(tmp_path / "other")
    signed = signing.sign(synthetic.run_report(), key)
    with pytest.raises(signing.SigningError, match="not among the trusted keys"):
        signing.verify(signed, signing.load_trusted(other_public))


def test_a_swapped_key_is_not_trusted_by_its_claimed_id(keys, tmp_path):
    """A forger signs with their own key but writes the trusted key's id into the record."""
    key, public = keys
    forger = signing.load_private_key(signing.generate_keypair(tmp_path / "forger")[0])
    signed = signing.sign(synthetic.run_report(), forger)
    signed["signature"]["key_id"] = signing.key_id(signing.raw_public_key(key.public_key()))
    with pytest.raises(signing.SigningError, match="public key is not trusted key"):
        signing.verify(signed, signing.load_trusted(public))
    signed["signature"]["public_key"] = signing.raw_public_key(key.public_key()).hex()
    with pytest.raises(signing.SigningError, match="does not match its content"):
        signing.verify(signed, signing.load_trusted(public))


def test_unsigned_with_trusted_keys_fails(keys):
    _, public = keys
    with pytest.raises(signing.SigningError, match="unsigned"):
        signing.verify(synthetic.run_report(), signing.load_trusted(public))


def test_bad_key_files_are_named(tmp_path, keys):
    key, public = keys
    with pytest.raises(signing.SigningError, match="does not exist"):
        signing.load_private_key(tmp_path / "absent")
    with pytest.raises(signing.SigningError, match="not an unencrypted PEM private key"):
        signing.load_private_key(public)
    (tmp_path / "empty").mkdir()
    with pytest.raises(signing.SigningError, match="holds no .pem or .pub files"):
        signing.load_trusted(tmp_path / "empty")
    with pytest.raises(signing.SigningError, match="neither a PEM file nor a directory"):
        signing.load_trusted(tmp_path / "absent")
    (tmp_path / "junk.pem").write_text("not a key")
    with pytest.raises(signing.SigningError, match="junk.pem is not a PEM public key"):
        signing.load_trusted(tmp_path / "junk.pem")


def test_a_clear_error_without_cryptography(monkeypatch, tmp_path):
    for name in list(sys.modules):
        if name == "cryptography" or name.startswith("cryptography."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "cryptography", None)
    with pytest.raises(signing.SigningError, match=r"pip install 'kernellab-harness\[sign\]'"):
        signing.generate_keypair(tmp_path / "k")


def test_bench_cli_keygen_and_sign(tmp_path, capsys, monkeypatch):
    """A real CPU run signed by kernellab-bench: verified by its public key, consistent with itself,
    and a resealed p50 / 50 in it named by the consistency check. Inputs do not rotate here: the
    thousands of input sets that outgrow a large cache would take minutes, and signing needs none."""
    import dataclasses

    from kernellab.harness import cli
    from kernellab.harness.cli import main

    configured = cli.config_for
    monkeypatch.setattr(cli, "config_for", lambda suite, args: dataclasses.replace(configured(suite, args),
                                                                                   rotate=False))

    assert main(["--keygen", str(tmp_path / "lab")]) == 0
    assert "public key: " in capsys.readouterr().out
    assert main(["--keygen", str(tmp_path / "lab")]) == 2
    assert "--keygen: key file" in capsys.readouterr().err
    assert main(["--suite", "cpu-ops", "--sign", str(tmp_path / "absent"), "--out", str(tmp_path)]) == 2
    assert "--sign: signing key" in capsys.readouterr().err
    out = tmp_path / "run.json"
    code = main(["--suite", "cpu-ops", "--cases", "softmax_128x512_fp32", "--modes", "e2e_throughput", "--rounds", "2",
                 "--samples", "3", "--warmup", "0", "--iterations", "1", "--quiet", "--no-plot",
                 "--sign", str(tmp_path / "lab"), "--out", str(out)])
    assert code == 0
    report = report_io.load(out)
    assert signing.verify(report, signing.load_trusted(tmp_path / "lab.pub"))
    assert len(report["cases"]) >= 2 and consistency.check(report) == []
    i = next(k for k, c in enumerate(report["cases"]) if c["modes"])
    report["cases"][i]["modes"]["e2e_throughput"]["summary_us"]["p50"] /= 50
    report["sha256"] = report_io.report_hash(report)
    assert f"cases[{i}].modes.e2e_throughput.summary_us.p50" in {f.path for f in consistency.check(report)}
    out.write_text(json.dumps(report))
    with pytest.raises(signing.SigningError, match="does not match its content"):
        signing.verify(report_io.load(out), signing.load_trusted(tmp_path))
