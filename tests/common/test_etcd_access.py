"""FABRIC_ETCD_* are checked at start, each bad value named; plain HTTP to an etcd off loopback is
refused unless the operator says --insecure-store."""

from __future__ import annotations

import pytest

from common.envvars import EnvError
from common.store.connect import open_store
from common.store.etcd_access import from_env
from common.store.etcd_pki import issue_client


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("etcd-access")
    crt, key, ca = issue_client(root / "state", "fabricd", root / "certs")
    _, other_key, _ = issue_client(root / "state", "gateway", root / "certs")
    password = root / "fabricd.password"
    password.write_text("s3cret\n")
    empty = root / "empty.password"
    empty.write_text("\n")
    return {"ca": str(ca), "crt": str(crt), "key": str(key), "other_key": str(other_key), "pw": str(password),
            "empty": str(empty), "missing": str(root / "nope.pem")}


def full(files, **changes) -> dict[str, str]:
    env = {"FABRIC_ETCD_CA": files["ca"], "FABRIC_ETCD_CERT": files["crt"], "FABRIC_ETCD_KEY": files["key"],
           "FABRIC_ETCD_USER": "fabricd", "FABRIC_ETCD_PASSWORD_FILE": files["pw"]}
    return {k: v for k, v in (env | changes).items() if v is not None}


def test_a_complete_setting_is_read_once_with_the_password_from_its_file(files):
    access = from_env(full(files))
    assert access is not None and access.tls and access.user == "fabricd" and access.password == "s3cret"
    assert "s3cret" not in repr(access)
    assert from_env({}) is None


@pytest.mark.parametrize(("changes", "named"), [
    ({"FABRIC_ETCD_KEY": None}, "FABRIC_ETCD_KEY unset"),
    ({"FABRIC_ETCD_CA": None, "FABRIC_ETCD_CERT": None, "FABRIC_ETCD_KEY": None}, "FABRIC_ETCD_USER is set without"),
    ({"FABRIC_ETCD_PASSWORD_FILE": None}, "FABRIC_ETCD_PASSWORD_FILE unset"),
    ({"FABRIC_ETCD_CA": "missing"}, "FABRIC_ETCD_CA="),
    ({"FABRIC_ETCD_CERT": "pw"}, "FABRIC_ETCD_CERT="),
    ({"FABRIC_ETCD_KEY": "crt"}, "FABRIC_ETCD_KEY="),
    ({"FABRIC_ETCD_KEY": "other_key"}, "is not the key of FABRIC_ETCD_CERT"),
    ({"FABRIC_ETCD_PASSWORD_FILE": "empty"}, "FABRIC_ETCD_PASSWORD_FILE="),
    ({"FABRIC_ETCD_PASSWORD_FILE": "missing"}, "cannot be read"),
])
def test_each_bad_value_is_refused_naming_its_variable(files, changes, named):
    env = full(files, **{k: (files[v] if v in files else v) for k, v in changes.items()})
    with pytest.raises(EnvError, match=named) as err:
        from_env(env)
    assert "s3cret" not in str(err.value)


def test_both_processes_refuse_to_start_on_a_bad_value(files):
    from controlplane.settings import SettingsError as FabricdSettingsError
    from controlplane.settings import load as fabricd_load
    from gateway.settings import SettingsError as GatewaySettingsError
    from gateway.settings import load as gateway_load

    bad = full(files, FABRIC_ETCD_CA=files["missing"])
    with pytest.raises(FabricdSettingsError, match="FABRIC_ETCD_CA"):
        fabricd_load(bad)
    with pytest.raises(GatewaySettingsError, match="FABRIC_ETCD_CA"):
        gateway_load(bad)
    assert fabricd_load(full(files)).store_access.user == "fabricd"
    assert gateway_load(full(files)).store_access.tls


def test_plain_http_off_loopback_needs_insecure_store(files):
    with pytest.raises(ValueError, match="--insecure-store") as err:
        open_store("etcd://127.0.0.1:2379,10.0.0.7:2379")
    assert "10.0.0.7" in str(err.value) and "127.0.0.1 " not in str(err.value)
    open_store("etcd://10.0.0.7:2379", insecure=True).close()  # the operator said so
    open_store("etcd://127.0.0.1:2379,localhost:2379,[::1]:2379").close()  # loopback stays on this host
    open_store("etcd://10.0.0.7:2379", access=from_env(full(files))).close()  # TLS
    with pytest.raises(ValueError, match="not etcd"):
        open_store("sqlite:///tmp/x.db", access=from_env(full(files)))
