"""The distribution installs as one namespace, ``streamloop``, and runs beside a service's own
top-level ``engine`` and ``handlers`` packages (common names in aiohttp, FastAPI and bot services).

Built from this checkout into a wheel, installed into a fresh virtual environment (its dependencies
are lent by the test's own environment), and run from a directory that has packages of those names.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SERVICE = textwrap.dedent('''
    import engine, handlers  # the service's own, first on sys.path

    assert engine.OWN and handlers.OWN

    import streamloop
    from streamloop import KafkaStreams, StreamsBuilder
    from streamloop.serdes import StringSerde
    from streamloop.testing import TopologyTestDriver

    builder = StreamsBuilder()
    (builder.stream("in", key_serde=StringSerde(), value_serde=StringSerde())
            .map_values(str.upper).to("out", key_serde=StringSerde(), value_serde=StringSerde()))
    # The default handlers are named by their installed names and load from the distribution.
    with TopologyTestDriver(builder.build(), {"application.id": "svc"}) as driver:
        source = driver.create_input_topic("in", StringSerde(), StringSerde())
        sink = driver.create_output_topic("out", StringSerde(), StringSerde())
        source.pipe_input("k", "hello")
        assert sink.read_key_value() == ("k", "HELLO")
    print(streamloop.__file__)
    print(KafkaStreams.__module__)
''')


@pytest.mark.timeout(300)
def test_the_wheel_runs_beside_a_services_own_engine_and_handlers_packages(tmp_path: Path) -> None:
    # Built from a copy: a build writes its metadata (streamloop.egg-info) beside the sources, where
    # it would also make pip take the checkout for an installed streamloop.
    source = tmp_path / "source"
    source.mkdir()
    for part in ("pyproject.toml", "README.md", "engine", "handlers"):
        copy = shutil.copytree if (ROOT / part).is_dir() else shutil.copy2
        copy(ROOT / part, source / part, **({"symlinks": True, "ignore": shutil.ignore_patterns("__pycache__")}
                                            if copy is shutil.copytree else {}))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(wheels), str(source)], check=True, capture_output=True, cwd=tmp_path, env=env)
    [wheel] = wheels.glob("streamloop-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=env)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    str(wheel)], check=True, capture_output=True, cwd=tmp_path, env=env)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # The dependencies (aiokafka, anyio, orjson) come from this environment, added after the venv's
    # own site-packages, so that streamloop itself is the one just installed.
    (site / "lent_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    service = tmp_path / "service"
    for package in ("engine", "handlers"):
        (service / package).mkdir(parents=True)
        (service / package / "__init__.py").write_text("OWN = True\n")
    (service / "main.py").write_text(SERVICE)
    done = subprocess.run([str(python), "main.py"], cwd=service, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    installed, module = done.stdout.split()
    assert Path(installed).is_relative_to(site), installed
    assert module.startswith("streamloop.")


def test_the_package_list_names_every_package_of_the_repository() -> None:
    """``[tool.setuptools] packages`` is written out (the folders install under another name): a
    new subpackage missing from it would be missing from the wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"streamloop.handlers"} | {
        ".".join(("streamloop", *init.parent.relative_to(ROOT / "engine").parts))
        for init in (ROOT / "engine").rglob("__init__.py")}
    assert listed == found
