"""Context resolution (flag > environment > context) and the config file, as plain data, plus the
`fabricctl config` commands through the real console script with a temporary HOME."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from fabricctl.contexts import ConfigError, ConfigFile, Context, load, resolve, save
from fabricctl.settings import Flags
from fabricctl.settings import load as load_settings
from tests.controlplane.conftest import BIN


@pytest.fixture
def cfg(tmp_path) -> ConfigFile:
    ca = tmp_path / "ctx-ca.crt"
    ca.write_text("pem")
    return ConfigFile(tmp_path / "config", "lab", {
        "lab": Context(url="https://10.0.0.1:8443", ca=str(ca), token="ctx-token"),
        "prod": Context(url="https://prod:8443"),
    })


def test_context_values_apply_when_nothing_overrides(cfg):
    r = resolve(load_settings({}), cfg)
    assert (r.url, r.token, r.context, r.token_source) == ("https://10.0.0.1:8443", "ctx-token", "lab", "context")


def test_environment_beats_context_and_flag_beats_environment(cfg, tmp_path):
    env = {"FABRIC_URL": "https://env:1", "FABRIC_TOKEN": "env-token"}
    r = resolve(load_settings(env), cfg)
    assert (r.url, r.token, r.token_source) == ("https://env:1", "env-token", "env")
    token_file = tmp_path / "tok"
    token_file.write_text("flag-token\n")
    r = resolve(load_settings(env).with_flags(Flags(server="https://flag:2", token_file=str(token_file))), cfg)
    assert (r.url, r.token, r.token_source) == ("https://flag:2", "flag-token", "flag")


def test_context_flag_and_variable_pick_another_context(cfg):
    prod = load_settings({"FABRIC_CONTEXT": "prod"})
    assert resolve(prod, cfg).url == "https://prod:8443"
    assert resolve(prod.with_flags(Flags(context="lab")), cfg).context == "lab"
    with pytest.raises(ConfigError, match="context 'nope' is not in .*known: lab, prod"):
        resolve(load_settings({}).with_flags(Flags(context="nope")), cfg)


@pytest.mark.parametrize("url", ["notaurl", "ftp://x:1", "https://", "https://h:99999", "127.0.0.1:8443"])
def test_a_bad_url_names_its_source(cfg, url):
    with pytest.raises(ConfigError, match=f"FABRIC_URL '{url}' is not a URL"):
        resolve(load_settings({"FABRIC_URL": url}), cfg)


def test_a_missing_ca_names_the_variable_and_the_file(cfg):
    with pytest.raises(ConfigError, match="FABRIC_CA names /no/ca.crt, which does not exist"):
        resolve(load_settings({"FABRIC_CA": "/no/ca.crt"}), cfg)


def test_a_bad_variable_under_its_flag_is_no_error(cfg):
    settings = load_settings({"FABRIC_URL": "notaurl"}).with_flags(Flags(server="https://flag:2"))
    assert resolve(settings, cfg).url == "https://flag:2"


def test_the_config_file_follows_the_variables(tmp_path):
    assert load_settings({"FABRIC_CONFIG_DIR": "/d", "XDG_CONFIG_HOME": "/x"}).config_path == Path("/d/config")
    assert load_settings({"XDG_CONFIG_HOME": "/x", "HOME": "/h"}).config_path == Path("/x/fabric/config")
    assert load_settings({"HOME": "/h"}).config_path == Path("/h/.config/fabric/config")


def test_secrets_stay_out_of_every_repr(cfg):
    env = {"FABRIC_TOKEN": "tok-SECRET", "FABRIC_PASSWORD": "pw-SECRET", "FABRIC_NEW_PASSWORD": "new-SECRET"}
    settings = load_settings(env)
    assert (settings.token, settings.password, settings.new_password) == ("tok-SECRET", "pw-SECRET", "new-SECRET")
    shown = repr(settings) + repr(resolve(settings, cfg)) + repr(cfg) + repr(load_settings({}))
    assert "SECRET" not in shown and "ctx-token" not in shown and "https://10.0.0.1:8443" in shown


def test_save_is_0600_and_round_trips(cfg):
    save(cfg)
    assert stat.S_IMODE(os.stat(cfg.path).st_mode) == 0o600
    again = load(cfg.path)
    assert again.current == "lab" and again.contexts == cfg.contexts


def test_a_file_that_is_not_yaml_is_named(tmp_path):
    (tmp_path / "config").write_text("contexts: [unclosed")
    with pytest.raises(ConfigError, match=f"{tmp_path / 'config'}"):
        load(tmp_path / "config")


def test_config_commands_through_the_console_script(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    env.update(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    ca = tmp_path / "ca.crt"
    ca.write_text("pem")

    def ctl(*args, rc=0):
        proc = subprocess.run([str(BIN / "fabricctl"), "config", *args], capture_output=True, text=True, env=env)
        assert proc.returncode == rc, proc.stderr
        assert "Traceback" not in proc.stderr
        return proc

    ctl("set-context", "a", "--url", "https://a:1", "--ca", str(ca))
    ctl("set-context", "b", "--url", "https://b:2")
    assert ctl("current-context").stdout.strip() == "a"  # the first context becomes current
    ctl("use-context", "b")
    rows = ctl("get-contexts").stdout.splitlines()
    assert rows[0].split() == ["CURRENT", "NAME", "URL", "CA", "TOKEN"]
    assert [r.split()[:2] for r in rows[1:]] == [["a", "https://a:1"], ["*", "b"]]
    assert "set-context" in ctl("use-context", "zz", rc=1).stderr
    assert "--url 'nope' is not a URL" in ctl("set-context", "c", "--url", "nope", rc=2).stderr
    path = tmp_path / "xdg" / "fabric" / "config"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    ctl("delete-context", "b")
    assert ctl("get-contexts", "-o", "name").stdout.split() == ["context/a"]
