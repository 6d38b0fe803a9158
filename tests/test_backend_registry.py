"""Generation backends by name: the library knows its own (transformers, openai, vllm); a layer
above it adds one with ``register_backend``, as the demo adds its chain-arithmetic policy."""

import subprocess
import sys
import textwrap


def _run(code: str) -> None:
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_the_library_knows_no_synth_backend_until_the_demo_registers_it():
    _run(
        """
        import sys
        from betaprm.generation.factory import BackendOptions, backend_names, build_generator

        assert backend_names() == ("transformers", "openai", "vllm"), backend_names()
        assert not any(m.startswith("betaprm.synth") for m in sys.modules)
        assert BackendOptions().backend == "transformers"
        bad = BackendOptions(backend="synth").backend_problems()
        assert bad and "--backend must be one of transformers, openai, vllm" in bad[0], bad

        from betaprm.synth import SynthPolicy, World

        assert backend_names()[-1] == "synth"
        opts = BackendOptions(backend="synth")
        assert opts.backend_problems() == []  # the synth policy needs no --policy
        world = World()
        gen = build_generator(opts, seed=3, world=world, count_tokens=len)
        assert isinstance(gen, SynthPolicy) and gen.world is world and gen.count_tokens is len
        """
    )


def test_a_registered_backend_gets_the_options_seed_and_context():
    _run(
        """
        from betaprm.generation.factory import BackendOptions, build_generator, register_backend

        made = []
        register_backend("echo", lambda opts, seed, **context: made.append((opts.policy, seed, context)) or "gen")
        opts = BackendOptions(backend="echo")
        assert opts.backend_problems() == ["--backend echo needs --policy (the model to generate with)"]
        opts.policy = "p"
        assert opts.backend_problems() == []
        assert build_generator(opts, seed=7, extra=1) == "gen"
        assert made == [("p", 7, {"extra": 1})]
        """
    )
