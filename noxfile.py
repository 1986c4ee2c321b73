"""Developer sessions: ``nox -s tests lint typecheck migrations docs bench model``."""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True

PG_URL = os.environ.get(
    "AGENTCONTEXT_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite on SQLite and PostgreSQL (``-- -k sqlite`` to narrow it)."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs, env={"AGENTCONTEXT_TEST_POSTGRES_URL": PG_URL})


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    session.install("ruff")
    session.run("ruff", "check", "src", "tests", "benchmarks", "examples", "migrations")
    session.run("ruff", "format", "--check", "src", "tests", "benchmarks", "examples", "migrations")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the package."""
    session.install("-e", ".[test]", "mypy")
    session.run("mypy", "--strict", "src/agentcontext")


@nox.session
def migrations(session: nox.Session) -> None:
    """Migration tests: one head, up/down/up, models == migrations, concurrent upgrades."""
    session.install("-e", ".[test]")
    session.run(
        "pytest", "tests/store/test_migrations.py", "tests/packaging", *session.posargs,
        env={"AGENTCONTEXT_TEST_POSTGRES_URL": PG_URL},
    )


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site strictly."""
    session.install("-e", ".[docs]")
    session.run("mkdocs", "build", "--strict")


@nox.session
def bench(session: nox.Session) -> None:
    """Every benchmark; prints ratios against baselines measured in the same run."""
    session.install("-e", ".[test]")
    for script in sorted(os.listdir("benchmarks")):
        if script.startswith("bench_") and script.endswith(".py"):
            session.run("python", f"benchmarks/{script}")


@nox.session
def model(session: nox.Session) -> None:
    """The model-checked graph with more examples: ``nox -s model -- 2000`` (default 2000)."""
    session.install("-e", ".[test]")
    examples = session.posargs[0] if session.posargs else "2000"
    session.run(
        "pytest", "tests/reliability/test_model.py", "-k", "matches_the_model",
        env={
            "AGENTCONTEXT_TEST_POSTGRES_URL": PG_URL,
            "AGENTCONTEXT_MODEL_EXAMPLES": examples,
        },
    )


@nox.session
def cancel(session: nox.Session) -> None:
    """The cancellation fuzz with more rounds: ``nox -s cancel -- 500 [seed]``."""
    session.install("-e", ".[test]")
    rounds = session.posargs[0] if session.posargs else "500"
    env = {"AGENTCONTEXT_TEST_POSTGRES_URL": PG_URL, "AGENTCONTEXT_CANCEL_ROUNDS": rounds}
    if len(session.posargs) > 1:
        env["AGENTCONTEXT_CANCEL_SEED"] = session.posargs[1]
    session.run("pytest", "tests/reliability/test_cancellation.py", env=env)


@nox.session
def parity(session: nox.Session) -> None:
    """Search parity: the same queries on SQLite and PostgreSQL give the same hits."""
    session.install("-e", ".[test]")
    session.run(
        "pytest", "tests/store/test_search_parity.py",
        env={"AGENTCONTEXT_TEST_POSTGRES_URL": PG_URL},
    )
