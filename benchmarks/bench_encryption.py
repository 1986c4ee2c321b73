"""Encryption at rest: an encrypted store against the same store plain, in one run.

    python benchmarks/bench_encryption.py [--backends sqlite,postgres,mariadb] [--sizes 10000]
                                          [--cold-reps 7] [--saves 300] [--search-reps 30]
                                          [--harness ../shared] [--out FILE]

A cell beside the shared harness (``../shared/bench``, read-only for the project): the same
workload (``bench.workload.make_messages``: alternating user/assistant messages of ~400
characters, same seed) driven the same way (``bench.adapters.agentcontext_adapter``:
``SqlContextStore(url)`` + ``ContextEngine``, ``engine.set(user(...) | assistant_text(...))`` +
``await engine.save()`` per call, load = ``resolve()`` of a fresh engine), once on a plain
store and once on a store opened with ``encryption=LocalKeyProvider(<32 random bytes>,
keyring=<a SQLite file of its own>)``. Each backend runs in its own process, each variant on a
fresh database (SQLite file / PostgreSQL database / MariaDB database, dropped afterwards);
the two variants' calls take turns (plain, encrypted, then encrypted, plain, ...), so a slow
minute of the machine falls on both.

Per backend and size N (default 10 000):

1. **bulk save**: the N-message chat written 100 messages per call, as the harness's
   batch=100 cell (median per call; first and last 25 calls in the JSON); then, untimed,
   PostgreSQL ``VACUUM (ANALYZE)`` / MariaDB ``ANALYZE TABLE`` as the harness does;
2. **cold resolve**: a NEW ``SqlContextStore`` (its memory of decoded chains empty) opened and
   connected untimed, a new ``ContextEngine``, time of ``await engine.resolve()`` (median of
   ``--cold-reps``); the first load of each variant is checked against the workload (role and
   text of every message). The key provider is the process's one (its keys in memory, as in a
   running application); the row "cold, new provider too" also makes a new provider before
   each store (a process's first request: the keyring opened and the key unwrapped);
3. **warm resolve**: a fresh engine on that same store, served by the store's memory of
   decoded chains (checked: ``store.chain_memory.hits`` grows);
4. **one-message save**: ``engine.set(user(...))`` / ``assistant_text`` + ``save()`` into a
   second chat of the same user, one engine per variant (median of ``--saves``);
5. **search**: ``store.search_messages(chat, word)`` for a common word (the word of 5+ letters
   in the most messages: ``snippet``, in about 60 % of them) and a rare one (a number in
   exactly one message), ``store.search_user_messages(user, word)`` for the same two (20 hits
   at most; median of ``--search-reps`` after one untimed call); plain and encrypted must find
   the same messages.

The encrypted database is checked to hold ciphertext (a message's stored data starts with the
sealed prefix), the plain one to hold text. Prints plain, encrypted and encrypted/plain per
cell and backend; writes every sample and the machine facts to ``--out`` (default
``benchmarks/results/encryption-<short commit>.json``). The ratios of one run are what count:
the machine's other load falls on both variants alike.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import gc
import json
import os
import platform
import re
import secrets
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

GOALS = {"cold": 1.3, "save1": 1.3, "search": 1.5}
SECOND_CHAT = "chat-002"
PACKAGES = ("agentcontext", "sqlalchemy", "aiosqlite", "asyncpg", "asyncmy", "cryptography")
SEALED_PREFIX = "acenc1."


def _harness(path: str) -> bool:
    """Make ``bench`` (the shared harness) importable: its workload and adapter, not copies."""
    folder = str(Path(path).resolve())
    if not (Path(folder) / "bench" / "workload.py").is_file():
        return False
    if folder not in sys.path:
        sys.path.insert(1, folder)
    return True


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def _ms(xs: list[float]) -> list[float]:
    return [round(x * 1e3, 4) for x in xs]


# --- the child: one backend, every size ---------------------------------------------------------


def _db(backend: str, variant: str, n: int, folder: str, args: argparse.Namespace) -> Any:
    from bench.adapters.base import Db

    name = f"acbench_enc_{variant}_{n}_{os.getpid()}"
    if backend == "sqlite":
        return Db("sqlite", sqlite_path=os.path.join(folder, f"{name}.db"))
    if backend == "postgres":
        return Db(
            "postgres", pg_host=args.pg_host, pg_port=args.pg_port, pg_user=args.pg_user, pg_db=name
        )
    return Db(
        "mariadb",
        my_host=args.my_host,
        my_port=args.my_port,
        my_user=args.my_user,
        my_password=args.my_password,
        my_db=name,
    )


def _cell_class() -> Any:
    from bench.adapters.agentcontext_adapter import CHAT, USER, AgentContext, new_store

    class Cell(AgentContext):
        """The harness's agentcontext adapter, its store opened with ``encryption=`` when the
        variant has a provider (``provider_factory``: a new provider per open)."""

        def __init__(self, backend: str, variant: str, provider: Any = None) -> None:
            super().__init__(backend)
            self.variant = variant
            self.provider = provider
            self.provider_factory: Any = None
            self.own_provider: Any = None

        async def open(self) -> None:
            assert self.db
            kw: dict[str, Any] = {}
            if self.provider_factory is not None:
                self.own_provider = self.provider_factory()
                kw["encryption"] = self.own_provider
            elif self.provider is not None:
                kw["encryption"] = self.provider
            self.store = new_store(self.ac, self.db, **kw)
            await self.store.initialize()
            self.engine = self.ac.ContextEngine(store=self.store, chat_id=CHAT, user_id=USER)

        async def close(self) -> None:
            await super().close()
            if self.own_provider is not None:
                provider, self.own_provider = self.own_provider, None
                await provider.aclose()

    Cell.CHAT, Cell.USER = CHAT, USER  # type: ignore[attr-defined]
    return Cell


def _verify(adapter: Any, items: list[Any], expected: list[dict[str, str]], what: str) -> None:
    if len(items) != len(expected):
        raise AssertionError(f"{what}: loaded {len(items)} messages, expected {len(expected)}")
    for i, (item, m) in enumerate(zip(items, expected, strict=True)):
        got = adapter.normalize(item)
        if got != (m["role"], m["text"]):
            raise AssertionError(f"{what}: message {i} differs: {got[0]!r} {got[1][:60]!r}")


def _words(messages: list[dict[str, str]]) -> tuple[str, int, str, int]:
    """A common word (in the most messages, 5+ letters) and a rare one (a number in exactly
    one message, the first such), with the number of messages holding each."""
    per_message: Counter[str] = Counter()
    for m in messages:
        per_message.update(set(re.findall(r"\w+", m["text"].lower())))
    common, common_n = max(
        ((w, c) for w, c in per_message.items() if w.isalpha() and w.isascii() and len(w) >= 5),
        key=lambda wc: (wc[1], wc[0]),
    )
    rare = next(w for w, c in sorted(per_message.items()) if c == 1 and w.isdigit() and len(w) == 5)
    return common, common_n, rare, 1


def _stored_prefix(db: Any) -> str:
    """The first characters of one stored message's data (out of band, untimed)."""
    if db.backend == "sqlite":
        con = sqlite3.connect(db.sqlite_path)
        try:
            row = con.execute("SELECT data FROM messages LIMIT 1").fetchone()
        finally:
            con.close()
        value = row[0]
        # SQLite keeps a sealed value as bytes (NUL, then the prefix), not as a JSON string.
        shown = value[:12].decode("latin-1") if isinstance(value, bytes) else str(value)[:12]
        return shown.replace("\x00", "")
    if db.backend == "postgres":
        return db.psql("SELECT left(data::text, 12) FROM messages LIMIT 1")
    return db.mysql("SELECT LEFT(data, 12) FROM messages LIMIT 1")


def _order(pair: list[Any], rep: int) -> list[Any]:
    return pair if rep % 2 == 0 else pair[::-1]


async def _run_size(backend: str, n: int, args: argparse.Namespace, folder: str) -> dict[str, Any]:
    from bench.workload import make_messages, payload_bytes

    import agentcontext as ac

    Cell = _cell_class()
    messages = make_messages(n + args.saves, seed=args.seed)
    chat, singles = messages[:n], messages[n:]
    common, common_n, rare, rare_n = _words(chat)
    gc.collect()
    gc.freeze()
    res: dict[str, Any] = {
        "backend": backend,
        "n": n,
        "payload_bytes": payload_bytes(chat),
        "words": {
            "common": common,
            "common_messages": common_n,
            "rare": rare,
            "rare_messages": rare_n,
        },
        "samples_ms": {},
        "checks": {},
    }
    samples: dict[str, dict[str, list[float]]] = res["samples_ms"]
    master = secrets.token_bytes(32)
    keyring = os.path.join(folder, f"keyring-{n}.db")

    def new_provider() -> Any:
        return ac.LocalKeyProvider(master, keyring=keyring)

    provider = new_provider()
    plain = Cell(backend, "plain")
    enc = Cell(backend, "encrypted", provider)
    cells = [plain, enc]
    dbs = {c.variant: _db(backend, c.variant, n, folder, args) for c in cells}
    phase = "setup"
    try:
        for c in cells:
            dbs[c.variant].create()
            await c.setup(dbs[c.variant], chat, n // 2)

        # 1. The chat, 100 messages per call, the variants taking turns call by call.
        phase = "bulk save"
        bulk: dict[str, list[float]] = {"plain": [], "encrypted": []}
        perf = time.perf_counter
        gc.collect()
        for call, start in enumerate(range(0, n, args.batch)):
            batch = chat[start : start + args.batch]
            for c in _order(cells, call):
                t0 = perf()
                await c.append_batch(batch, start)
                bulk[c.variant].append(perf() - t0)
        samples["bulk_save"] = {k: _ms(v) for k, v in bulk.items()}
        for c in cells:
            await c.close()
            db = dbs[c.variant]
            size = db.size()  # MariaDB: ANALYZE TABLE first, as the harness
            res.setdefault("bytes_per_message", {})[c.variant] = round(size["bytes"] / n, 1)
            if backend == "postgres":
                db.psql("VACUUM (ANALYZE)")
            res["checks"][f"stored_prefix_{c.variant}"] = _stored_prefix(db)
        if not res["checks"]["stored_prefix_encrypted"].lstrip('"').startswith(SEALED_PREFIX):
            raise AssertionError(
                f"the encrypted store holds {res['checks']['stored_prefix_encrypted']!r}"
            )
        if SEALED_PREFIX in res["checks"]["stored_prefix_plain"]:
            raise AssertionError("the plain store holds sealed values")

        # 2, 3. Cold resolve on a new store object, then warm by a fresh engine on it.
        phase = "resolve"
        fresh = Cell(backend, "encrypted, new provider")
        fresh.provider_factory = new_provider
        fresh.db = dbs["encrypted"]
        trio = [plain, enc, fresh]
        opens: dict[str, list[float]] = {c.variant: [] for c in trio}
        colds: dict[str, list[float]] = {c.variant: [] for c in trio}
        warms: dict[str, list[float]] = {c.variant: [] for c in trio}
        warm_served: dict[str, list[bool]] = {c.variant: [] for c in trio}
        for rep in range(args.cold_reps):
            order = trio[rep % 3 :] + trio[: rep % 3]
            if rep % 2:
                order = order[::-1]
            for c in order:
                gc.collect()
                t0 = perf()
                await c.open()
                t1 = perf()
                items = await c.load_all()
                t2 = perf()
                if rep < 3:
                    _verify(c, items, chat, f"{c.variant} cold resolve")
                elif len(items) != n:
                    raise AssertionError(f"{c.variant} cold resolve: {len(items)} messages")
                del items
                gc.collect()
                hits = c.store.chain_memory.hits
                t3 = perf()
                items = await c.load_all()
                t4 = perf()
                warm_served[c.variant].append(c.store.chain_memory.hits > hits)
                if rep < 3:
                    _verify(c, items, chat, f"{c.variant} warm resolve")
                del items
                gc.collect()
                await c.close()
                opens[c.variant].append(t1 - t0)
                colds[c.variant].append(t2 - t1)
                warms[c.variant].append(t4 - t3)
        samples["open"] = {k: _ms(v) for k, v in opens.items()}
        samples["cold_resolve"] = {k: _ms(v) for k, v in colds.items() if k != fresh.variant}
        samples["cold_resolve_new_provider"] = {
            "plain": _ms(colds["plain"]),
            "encrypted": _ms(colds[fresh.variant]),
        }
        samples["warm_resolve"] = {k: _ms(v) for k, v in warms.items() if k != fresh.variant}
        res["checks"]["warm_served_by_memory"] = {k: all(v) for k, v in warm_served.items()}
        if not all(all(v) for v in warm_served.values()):
            raise AssertionError(
                f"a warm resolve was not served by the store's memory: {warm_served}"
            )

        # 5. Search, on stores opened afresh (one untimed call per query first).
        phase = "search"
        for c in cells:
            await c.open()
        queries = {
            "search_chat_common": ("chat", common),
            "search_chat_rare": ("chat", rare),
            "search_user_common": ("user", common),
            "search_user_rare": ("user", rare),
        }

        async def search(c: Any, scope: str, word: str) -> list[Any]:
            if scope == "chat":
                return await c.store.search_messages(Cell.CHAT, word)
            return await c.store.search_user_messages(Cell.USER, word)

        found: dict[str, Any] = {}
        for key, (scope, word) in queries.items():
            ids = {}
            for c in cells:
                hits = await search(c, scope, word)
                ids[c.variant] = [h.message.id for h in hits]
            found[key] = {
                "hits": len(ids["plain"]),
                "same_as_plain": ids["plain"] == ids["encrypted"],
            }
            if not ids["plain"] or sorted(ids["plain"]) != sorted(ids["encrypted"]):
                raise AssertionError(
                    f"{key} ({word!r}): plain found {len(ids['plain'])}, "
                    f"encrypted {len(ids['encrypted'])}, not the same messages"
                )
            times: dict[str, list[float]] = {"plain": [], "encrypted": []}
            gc.collect()
            for rep in range(args.search_reps):
                for c in _order(cells, rep):
                    t0 = perf()
                    await search(c, scope, word)
                    times[c.variant].append(perf() - t0)
            samples[key] = {k: _ms(v) for k, v in times.items()}
        res["checks"]["search"] = found

        # 4. One message per save, into a second chat of the same user.
        phase = "one-message save"
        for c in cells:
            c.engine = ac.ContextEngine(store=c.store, chat_id=SECOND_CHAT, user_id=Cell.USER)
        saves: dict[str, list[float]] = {"plain": [], "encrypted": []}
        gc.collect()
        for i, m in enumerate(singles):
            for c in _order(cells, i):
                t0 = perf()
                await c.append_batch([m], n + i)
                saves[c.variant].append(perf() - t0)
        samples["save_1"] = {k: _ms(v) for k, v in saves.items()}
        for c in cells:
            check = ac.ContextEngine(store=c.store, chat_id=SECOND_CHAT, user_id=Cell.USER)
            _verify(c, (await check.resolve()).messages, singles, f"{c.variant} saved messages")
            await c.close()
        res["status"] = "ok"
    except Exception as exc:
        res.update(
            status="error",
            phase=phase,
            error=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(),
        )
    finally:
        for c in cells:
            with contextlib.suppress(Exception):
                await c.close()
        await provider.aclose()
        for db in dbs.values():
            try:
                db.drop()
            except Exception as exc:  # pragma: no cover
                res.setdefault("drop_errors", []).append(str(exc))
        gc.unfreeze()
    return res


async def _child(args: argparse.Namespace) -> list[dict[str, Any]]:
    folder = tempfile.mkdtemp(prefix="acbench-enc-")
    out = []
    try:
        for n in args.size_list:
            print(f"[{args.one}] N={n} ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            r = await _run_size(args.one, n, args, folder)
            r["wall_s"] = round(time.perf_counter() - t0, 1)
            out.append(r)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return out


# --- the parent: machine facts, one child per backend, the table ------------------------------


def _git(*cmd: str) -> str:
    try:
        return subprocess.run(
            ["git", *cmd], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _server_versions(args: argparse.Namespace, backends: list[str]) -> dict[str, Any]:
    from bench.adapters.base import Db

    out: dict[str, Any] = {}
    if "postgres" in backends:
        try:
            out["postgres"] = Db(
                "postgres", pg_host=args.pg_host, pg_port=args.pg_port, pg_user=args.pg_user
            ).psql("SELECT version()")
        except Exception as exc:
            out["postgres"] = f"unreachable: {exc}"
    if "mariadb" in backends:
        try:
            db = Db(
                "mariadb",
                my_host=args.my_host,
                my_port=args.my_port,
                my_user=args.my_user,
                my_password=args.my_password,
            )
            out["mariadb"] = db.mysql(
                "SELECT CONCAT(VERSION(), ' innodb_flush_log_at_trx_commit=', "
                "@@innodb_flush_log_at_trx_commit)",
                db="information_schema",
            )
        except Exception as exc:
            out["mariadb"] = f"unreachable: {exc}"
    return out


def _machine() -> dict[str, Any]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    others = []
    try:
        ps = subprocess.run(["ps", "-eo", "pcpu=,args="], capture_output=True, text=True).stdout
        for line in ps.splitlines():
            pcpu, _, cmd = line.strip().partition(" ")
            if float(pcpu or 0) >= 20 and "bench_encryption" not in cmd:
                others.append(f"{pcpu}% {cmd[:80]}")
    except (OSError, ValueError):
        pass
    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "sqlite": sqlite3.sqlite_version,
        "packages": versions,
        "loadavg_at_start": list(os.getloadavg()),
        "busy_processes_at_start": others,
    }


ROWS = (
    ("cold_resolve", "cold resolve (new store + engine)", "cold"),
    ("cold_resolve_new_provider", "cold, new provider too", None),
    ("warm_resolve", "warm resolve (fresh engine, same store)", None),
    ("save_1", "save, 1 message per call", "save1"),
    ("bulk_save", "save, 100 messages per call", None),
    ("search_chat_common", "search_messages, common word", "search"),
    ("search_chat_rare", "search_messages, rare word", "search"),
    ("search_user_common", "search_user_messages, common word", "search"),
    ("search_user_rare", "search_user_messages, rare word", "search"),
)


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        if r.get("status") != "ok":
            continue
        for key, label, goal in ROWS:
            s = r["samples_ms"].get(key)
            if not s:
                continue
            p, e = _median(s["plain"]), _median(s["encrypted"])
            rows.append(
                {
                    "backend": r["backend"],
                    "n": r["n"],
                    "cell": key,
                    "label": label,
                    "plain_ms": round(p, 3),
                    "encrypted_ms": round(e, 3),
                    "ratio": round(e / p, 3),
                    "samples": len(s["plain"]),
                    "goal": GOALS.get(goal) if goal else None,
                    "met": (e / p <= GOALS[goal]) if goal else None,
                }
            )
    return rows


def _fmt_ms(x: float) -> str:
    return f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 100 else f"{x:.0f}"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| backend | N | cell | plain ms | encrypted ms | enc/plain | goal |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    for row in rows:
        goal = (
            ""
            if row["goal"] is None
            else (f"≤ {row['goal']}x {'met' if row['met'] else '**missed**'}")
        )
        lines.append(
            f"| {row['backend']} | {row['n']} | {row['label']} | "
            f"{_fmt_ms(row['plain_ms'])} | {_fmt_ms(row['encrypted_ms'])} | "
            f"{row['ratio']:.2f}x | {goal} |"
        )
    return "\n".join(lines)


def parent(args: argparse.Namespace) -> int:
    backends = [b for b in args.backends.split(",") if b]
    unknown = set(backends) - {"sqlite", "postgres", "mariadb"}
    if unknown:
        raise SystemExit(f"unknown backends: {sorted(unknown)}")
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    out_path = Path(args.out or ROOT / "benchmarks" / "results" / f"encryption-{commit}.json")
    doc: dict[str, Any] = {
        "meta": {
            "script": "benchmarks/bench_encryption.py",
            "argv": sys.argv[1:],
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "commit": commit,
            "worktree_modified": bool(_git("status", "--porcelain", "--untracked-files=no")),
            "harness": str(Path(args.harness).resolve()),
            "machine": _machine(),
            "servers": _server_versions(args, backends),
            "goals": GOALS,
        },
        "results": [],
    }
    t_all = time.perf_counter()
    for backend in backends:
        server = doc["meta"]["servers"].get(backend, "")
        if server.startswith("unreachable"):
            print(f"== {backend}: skipped, the server is {server}", flush=True)
            doc["results"].append({"backend": backend, "status": "skipped", "reason": server})
            continue
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            child_out = f.name
        cmd = [
            sys.executable,
            __file__,
            "--one",
            backend,
            "--child-out",
            child_out,
            *(a for a in sys.argv[1:] if a),
        ]
        print(f"== {backend}", flush=True)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, timeout=args.timeout)
            got = (
                json.loads(Path(child_out).read_text())
                if proc.returncode == 0
                else [
                    {
                        "backend": backend,
                        "status": "error",
                        "error": f"child exited {proc.returncode}",
                    }
                ]
            )
        except subprocess.TimeoutExpired:
            got = [{"backend": backend, "status": "error", "error": f"timeout {args.timeout}s"}]
        finally:
            Path(child_out).unlink(missing_ok=True)
        for r in got:
            if r.get("status") != "ok":
                print(
                    f"!! {backend} N={r.get('n')}: {r.get('phase', '')}: {r.get('error')}\n"
                    f"{r.get('traceback', '')}",
                    flush=True,
                )
        print(f"   {backend}: {time.perf_counter() - t0:.0f} s", flush=True)
        doc["results"].extend(got)
    doc["meta"]["total_s"] = round(time.perf_counter() - t_all, 1)
    doc["meta"]["loadavg_at_end"] = list(os.getloadavg())
    doc["summary"] = summarize(doc["results"])
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    m = doc["meta"]["machine"]
    print(
        f"\ncommit {commit}{' (modified work tree)' if doc['meta']['worktree_modified'] else ''}; "
        f"{m['cores']} cores; Python {m['python']}; load average {m['loadavg_at_start'][0]:.1f} "
        f"at start, {doc['meta']['loadavg_at_end'][0]:.1f} at end; {doc['meta']['total_s']} s\n"
    )
    print(table(doc["summary"]))
    for r in doc["results"]:
        if r.get("status") == "ok":
            print(
                f"\n{r['backend']} N={r['n']}: words {r['words']}; bytes/message "
                f"{r['bytes_per_message']}; checks {r['checks']}"
            )
    print(f"\nwrote {out_path}")
    return 0 if all(r.get("status") in ("ok", "skipped") for r in doc["results"]) else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--backends", default="sqlite,postgres,mariadb")
    p.add_argument("--sizes", default="10000", help="messages of the chat, comma-separated")
    p.add_argument("--cold-reps", type=int, default=7, help="cold (and warm) resolves per variant")
    p.add_argument("--saves", type=int, default=300, help="one-message saves per variant")
    p.add_argument("--search-reps", type=int, default=30, help="timed calls per search and variant")
    p.add_argument("--batch", type=int, default=100, help="messages per call of the bulk save")
    p.add_argument("--seed", type=int, default=20260101, help="the harness's workload seed")
    p.add_argument(
        "--harness",
        default=str(ROOT.parent / "shared"),
        help="the folder holding the shared harness's bench/ (default ../shared)",
    )
    p.add_argument("--pg-host", default="127.0.0.1")
    p.add_argument("--pg-port", type=int, default=5432)
    p.add_argument("--pg-user", default="postgres")
    p.add_argument("--my-host", default="127.0.0.1")
    p.add_argument("--my-port", type=int, default=3306)
    p.add_argument("--my-user", default="agentcontext")
    p.add_argument("--my-password", default="agentcontext")
    p.add_argument("--timeout", type=int, default=900, help="seconds per backend")
    p.add_argument("--out", help="JSON file (default benchmarks/results/encryption-<commit>.json)")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.size_list = [int(s) for s in args.sizes.split(",") if s]
    if args.cold_reps < 1 or args.saves < 1 or args.search_reps < 1:
        p.error("--cold-reps, --saves and --search-reps must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not _harness(args.harness):
        print(
            f"skipped: no shared harness at {Path(args.harness).resolve()} (bench/workload.py); "
            "pass --harness <the folder holding bench/>"
        )
        return 0
    if args.one:
        Path(args.child_out).write_text(json.dumps(asyncio.run(_child(args))))
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
