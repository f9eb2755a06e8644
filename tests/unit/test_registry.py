from types import SimpleNamespace

import pytest

from dspark_lightning import registry
from dspark_lightning.registry import RegistryError, create, names, register


def test_every_kind_exists_and_builtins_are_registered():
    assert set(registry.KINDS) == {
        "backbone",
        "seq_head",
        "conf_head",
        "drafter",
        "scheduler",
        "verifier",
        "proposer",
        "acceptance",
        "prompt_source",
        "regen_backend",
        "layout",
        "server",
        "features",
    }
    assert {"online", "cached", "streamed"} == set(names("features"))
    assert "dspark-hf" in names("layout")
    assert {"vllm", "sglang", "deepspec", "llamacpp"} <= set(names("server"))
    assert {"block", "chain"} <= set(names("proposer"))
    assert {"rejection", "coupled"} <= set(names("acceptance"))
    assert {"vanilla", "gated", "rnn"} <= set(names("seq_head"))
    assert "dense" in names("backbone")
    assert {"dspark", "dflash"} <= set(names("drafter"))
    assert {"gsm_symbolic", "humaneval", "mtbench", "sharegpt", "jsonl"} <= set(names("prompt_source"))
    assert set(names("regen_backend")) >= {"dspark", "hf", "openai", "vllm"}


def test_unknown_name_lists_available_names():
    with pytest.raises(RegistryError) as e:
        create("seq_head", "does-not-exist")
    msg = str(e.value)
    assert "does-not-exist" in msg and "vanilla" in msg and "rnn" in msg


def test_unknown_kind_is_an_error():
    with pytest.raises(RegistryError, match="kinds are"):
        names("nope")


def test_same_name_different_object_is_an_error_same_object_is_not(registered):
    class A:
        pass

    class B:
        pass

    registered("verifier", "_test_dup")(A)
    registered("verifier", "_test_dup")(A)  # idempotent
    with pytest.raises(RegistryError, match="already registered"):
        registered("verifier", "_test_dup")(B)


def test_entry_point_plugins_are_loaded_and_failures_reported(monkeypatch, registered):
    loaded = []

    def good():
        @register("scheduler", "_plugin_sched")
        class S:
            pass

        loaded.append(S)

    def bad():
        raise ImportError("missing dependency xyz")

    eps = [SimpleNamespace(name="good", load=lambda: good), SimpleNamespace(name="bad", load=lambda: bad)]
    monkeypatch.setattr(registry, "entry_points", lambda group: eps if group == registry.ENTRY_POINT_GROUP else [])
    errors = registry.load_plugins(force=True)
    assert loaded and "_plugin_sched" in names("scheduler")
    assert "bad" in errors and "xyz" in errors["bad"]  # reported, not fatal
    registry.plugin_errors.clear()


def test_a_plugin_calling_sys_exit_is_reported_not_fatal(monkeypatch):
    import sys

    eps = [SimpleNamespace(name="quitter", load=lambda: lambda: sys.exit(3))]
    monkeypatch.setattr(registry, "entry_points", lambda group: eps if group == registry.ENTRY_POINT_GROUP else [])
    errors = registry.load_plugins(force=True)
    assert "SystemExit" in errors["quitter"]
    registry.plugin_errors.clear()


def test_a_hanging_plugin_is_skipped_and_reported(monkeypatch):
    import threading

    release = threading.Event()
    eps = [SimpleNamespace(name="sleepy", load=lambda: lambda: release.wait(30))]
    monkeypatch.setattr(registry, "entry_points", lambda group: eps if group == registry.ENTRY_POINT_GROUP else [])
    monkeypatch.setenv(registry.TIMEOUT_ENV, "0.2")
    errors = registry.load_plugins(force=True)
    release.set()  # let the left-behind import thread end
    assert "still importing after 0.2 s" in errors["sleepy"] and "DSPARK_PLUGINS=none" in errors["sleepy"]
    assert "sleepy" not in registry.loaded_plugins
    registry.plugin_errors.clear()


def test_proposers_come_from_the_registry_by_the_drafter_class_name(registered):
    """One registry: a drafter class names its proposer (``proposer_name``), a factory registered with
    ``register("proposer", name)`` builds it, and a subclass inherits its base's proposer."""
    from dspark_lightning.drafters import ChainDrafter, Drafter
    from dspark_lightning.infer import make_proposer

    assert registry.get("proposer", Drafter.proposer_name).__name__ == "block_proposer"
    assert registry.get("proposer", ChainDrafter.proposer_name).__name__ == "chain_proposer"

    class Toy:
        proposer_name = "_test_toy"

    class SubToy(Toy):
        pass

    @registered("proposer", "_test_toy")
    def toy_proposer(drafter, batching="padded", confidence=None):
        return SimpleNamespace(drafter=drafter, batching=batching)

    made = make_proposer(SubToy(), batching="flat")
    assert isinstance(made.drafter, SubToy) and made.batching == "flat" and "_test_toy" in names("proposer")
    with pytest.raises(TypeError, match="no proposer registered"):
        make_proposer(object())
