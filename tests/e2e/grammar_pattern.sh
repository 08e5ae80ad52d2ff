# Structured output's patterns, formats and number ranges against independent references:
# for each pattern
# (anchored or not, classes, escapes, groups, alternation, bounded and unbounded repetition,
# text beyond ASCII), strings made by mutating strings that match and at random, sent as JSON
# strings raw and \u-escaped, are put to the recognizer (tests/tools/gram_check) and to
# Python's re (ECMAScript's \d \w \s: re.ASCII; "$": \Z). The recognizer must never take a
# string re refuses, and over ASCII the two must agree exactly (beyond ASCII it may take
# fewer: grammar_re.h). Each format's accepted strings must pass Python's own parser of that
# format (datetime, uuid, ipaddress), and its examples be taken. Numbers with a minimum or
# maximum: near the bounds and past them, decided as Python's float comparison decides.
source tests/e2e/lib.sh
CHECK="$WICK_TOOLS/gram_check"
[ -x "$CHECK" ] || fail "$CHECK is missing (make tools)"
python3 - "$CHECK" <<'EOF' || fail "patterns against Python's re"
import datetime, email.utils, ipaddress, json, random, re, subprocess, sys, uuid
tool = sys.argv[1]
rng = random.Random(11)
patterns = [
    (r"^[a-z]+-\d{2,3}$", ["abc-12", "x-999"]),
    (r"cat", ["a cat", "cat", "concat!"]),
    (r"^(ab|cd)*e?$", ["abcde", "", "cdab"]),
    (r"^\w+@\w+\.(com|org)$", ["a_1@b.com", "Z@q.org"]),
    (r"^[^aeiou\s]{3,5}$", ["xyz", "bcdfg", "B-9#"]),
    (r"^\S+ \S+$", ["ab cd", "x\u00e9 y"]),
    (r"^.{2}x.?$", ["abx", "\u00e91xz"]),
    (r"^[\u00e0-\u00ff]+$", ["\u00e9\u00e0", "\u00ff"]),
    (r"^(?:a|b)+(?<n>c)?$", ["abbac", "b"]),
    (r"^\(\d{3}\) \d{3}-\d{4}$", ["(555) 123-4567"]),
    (r"^[A-Z][a-z]*(?: [A-Z][a-z]*)*$", ["John Smith", "A"]),
    (r"^\u00e9t\xe9$", ["\u00e9t\u00e9"]),
    (r"^a{2,}b{0,2}$", ["aab", "aaaa", "aabb"]),
    (r"^[-+]?\d+(\.\d+)?$", ["-1.5", "42", "+0.25"]),
    (r"^[\d\-]+$", ["12-3", "-"]),
    (r"x+?y*?$", ["xy", "axxyy"]),
    (r"^$", [""]),
    (r"^\t\\\.\/$", ["\t\\./"]),
]
extra = " aZ09-_.@()\\/\"\t:;#+*?[]{}|^$,!~`'<>=&%\u00e9\u00e0\u20ac\u00a0\U0001f600"

def mutate(s, alphabet):
    s = list(s)
    for _ in range(rng.randint(1, 3)):
        op = rng.randint(0, 2)
        if op == 0 or not s:
            s.insert(rng.randint(0, len(s)), rng.choice(alphabet))
        elif op == 1:
            del s[rng.randrange(len(s))]
        else:
            s[rng.randrange(len(s))] = rng.choice(alphabet)
    return "".join(s)

def candidates(pos):
    alphabet = sorted(set("".join(pos) + extra))
    out = list(pos)
    for _ in range(250):
        out.append(mutate(rng.choice(pos) if pos else "", alphabet))
    for _ in range(100):
        out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8))))
    return out

def ours(schema, strings):
    docs = [json.dumps(s, ensure_ascii=bool(i % 2)) for i, s in enumerate(strings)]
    r = subprocess.run([tool, json.dumps(schema)], input="\n".join(docs) + "\n",
                       capture_output=True, text=True, check=True)
    got = [x == "1" for x in r.stdout.split()]
    assert len(got) == len(strings), (len(got), len(strings))
    return got

total = agree = took = 0
for pat, pos in patterns:
    py = re.compile(re.sub(r"\$$", r"\\Z", pat.replace("(?<", "(?P<")), re.ASCII)
    strings = candidates(pos)
    got = ours({"type": "string", "pattern": pat}, strings)
    for s, g in zip(strings, got):
        want = py.search(s) is not None
        assert not (g and not want), f"{pat!r} took {s!r}, which re refuses"
        if s.isascii() and "\r" not in s:
            assert g == want, f"{pat!r} on {s!r}: ours {g}, re {want}"
            agree += 1
        total += 1
        took += g
    assert all(ours({"type": "string", "pattern": pat}, pos)), f"{pat!r}: {pos}"

def date_ok(s):
    return bool(re.fullmatch(r"\d{4}-\d{2}-\d{2}", s, re.ASCII)) and \
        bool(datetime.date.fromisoformat(s))
def time_ok(s):
    return bool(re.fullmatch(r"\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})", s, re.ASCII)) and \
        bool(datetime.time.fromisoformat(s.replace("Z", "+00:00")))
def email_ok(s):
    local, _, dom = s.partition("@")
    return s.count("@") == 1 and local and "." in dom and ".." not in s and \
        not s.startswith(".") and not dom.startswith((".", "-")) and \
        not s.endswith((".", "-")) and email.utils.parseaddr(s)[1] == s
checks = {
    "date": (date_ok, ["2024-02-28", "1999-12-31", "2000-04-30"]),
    "time": (time_ok, ["23:59:59Z", "00:00:00.5+05:30"]),
    "date-time": (lambda s: "T" in s and date_ok(s.split("T")[0]) and
                  time_ok(s.split("T", 1)[1]), ["2024-01-31T12:00:00Z",
                                                 "1970-06-15T01:02:03.999-07:00"]),
    "uuid": (lambda s: len(s) == 36 and bool(uuid.UUID(s)),
             ["123e4567-e89b-12d3-a456-426614174000"]),
    "email": (email_ok, ["a.b+c@ex-ample.co.uk", "x@y.io"]),
    "ipv4": (lambda s: bool(ipaddress.IPv4Address(s)), ["192.168.0.1", "0.0.0.0",
                                                        "255.255.255.255"]),
}
fmt_took = {}
for fmt, (ok, pos) in checks.items():
    strings = candidates(pos) + ["2024-02-29", "2023-02-30", "24:00:00Z", "01.2.3.4",
                                 "256.1.1.1", "a@b", "A..b@c.com"]
    got = ours({"type": "string", "format": fmt}, strings)
    for s, g in zip(strings, got):
        if g:
            try:
                valid = ok(s)
            except ValueError:
                valid = False
            assert valid, f"format {fmt} took {s!r}, which Python refuses"
    assert all(ours({"type": "string", "format": fmt}, pos)), f"{fmt}: {pos}"
    fmt_took[fmt] = sum(got)
print(f"{len(patterns)} patterns: {total} strings, {took} taken, none that re refuses; "
      f"{agree} over ASCII, all as re decides")

# number ranges: decimals near and past the bounds; a number taken is a JSON number whose
# float is in range, and every decimal within the digit limits (no exponent, 18 digits before
# the point, 17 after) is decided as Python's float comparison decides it
ranges = [{"minimum": 0, "maximum": 1}, {"exclusiveMinimum": 0.1, "exclusiveMaximum": 0.3},
          {"minimum": -2.5, "maximum": -1}, {"minimum": 100}, {"exclusiveMaximum": 0},
          {"minimum": 0.3, "maximum": 0.3}, {"minimum": -1e-3, "exclusiveMaximum": 1e3}]
num_total = num_took = 0
for r in ranges:
    lo, hi = r.get("minimum", r.get("exclusiveMinimum")), r.get("maximum",
                                                                  r.get("exclusiveMaximum"))
    seeds = [str(x) for x in (lo, hi) if x is not None] + ["0", "-0", "0.5", "1", "-1", "99"]
    strings = set(seeds)
    for _ in range(400):
        x = rng.choice(seeds)
        op = rng.randint(0, 3)
        if op == 0:
            step = rng.choice([-1, 1]) * 10 ** -rng.randint(0, 17)
            x = f"{float(x) + step:.{rng.randint(0, 17)}f}"
        elif op == 1:
            x = x + str(rng.randint(0, 9)) if "." in x else x + "." + str(rng.randint(0, 9))
        elif op == 2:
            x = ("-" + x) if not x.startswith("-") else x[1:]
        else:
            x = f"{rng.uniform(-3, 3):.{rng.randint(0, 4)}f}"
        strings.add(x)
    strings = sorted(strings)
    got = [x == "1" for x in subprocess.run(
        [tool, json.dumps({"type": "number", **r})], input="\n".join(strings) + "\n",
        capture_output=True, text=True, check=True).stdout.split()]
    for s, g in zip(strings, got):
        def within(v):
            return all([("minimum" not in r or v >= r["minimum"]),
                        ("maximum" not in r or v <= r["maximum"]),
                        ("exclusiveMinimum" not in r or v > r["exclusiveMinimum"]),
                        ("exclusiveMaximum" not in r or v < r["exclusiveMaximum"])])
        ok = re.fullmatch(r"-?(0|[1-9]\d*)(\.\d+)?", s) is not None
        want = ok and within(float(s))
        assert not (g and not want), f"{r}: took {s}, out of range or not a number"
        small = ok and len(s.lstrip("-").split(".")[0]) <= 18 and \
            len((s.split(".") + [""])[1]) <= 17
        if small:
            assert g == want, f"{r}: {s}: ours {g}, Python {want}"
        num_total += 1
        num_took += g
print(f"{len(ranges)} number ranges: {num_total} decimals, {num_took} taken, each as "
      f"Python's float comparison decides")
print("formats, strings taken (each passing Python's parser): " +
      ", ".join(f"{k} {v}" for k, v in fmt_took.items()))
EOF
echo ok
