"""The Grafana dashboard and the Prometheus rules in deploy/ against what the server exports.

A real `sluice serve` (conftest.py) with a policy of every kind is driven and scraped; then every
PromQL expression of the dashboard (panel targets, variable queries) and of the rules file is
parsed, and each metric it selects must be in the scrape (recording rules' outputs count, with
the labels their own expressions yield), each label it names — in a matcher, in by()/without(),
on()/ignoring(), group_left()/group_right(), label_replace()'s source, histogram_quantile()'s
`le` — must be on what it applies to, both sides of a binary operation must be able to match, and
every `{{label}}` of a legend and `$labels.x` of an alert's annotations must survive the
expression. Prometheus adds `job` and `instance` to every scraped series and makes `up`; those
count as exported.

promtool (Debian's `prometheus` package) checks and unit-tests the rules when installed; with
SLUICE_REQUIRE_PROMTOOL=1 its absence is a failure.

Every check is a function of a file path returning the problems it finds, so the negative cases
below run the same checks on broken copies in a temporary directory.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

import pytest
import yaml

from conftest import KINDS

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "sluice.json"
RULES = REPO / "deploy" / "prometheus" / "sluice-rules.yml"
RULES_TEST = REPO / "deploy" / "prometheus" / "sluice-rules.test.yml"

TARGET_LABELS = frozenset({"job", "instance"})  # added by Prometheus to every scraped series
SYNTHETIC = {"up": TARGET_LABELS}               # made by Prometheus for every target

Metrics = Dict[str, FrozenSet[str]]  # metric name -> every label name its series carry


# ------------------------------------------------------------------------------------------------
# The exposition format


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Prometheus reads a value with Go's strconv.ParseFloat, which takes NaN and Inf in any case
# (the server writes "Nan").
_FLOAT = re.compile(r"^(?:[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|inf|infinity)|nan)$",
                    re.I)


def parse_exposition(text: str) -> Tuple[Metrics, Dict[str, str]]:
    """Prometheus text format 0.0.4 -> ({sample name: label names}, {family: type}).

    Samples are keyed by the name they are stored under (a histogram's _bucket, _sum, _count);
    a family declared with no sample is not in the first map, as Prometheus would store nothing
    for it. Raises ValueError on a malformed line."""
    metrics: Dict[str, Set[str]] = {}
    types: Dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
            continue
        m = _NAME.match(line)
        if not m:
            raise ValueError(f"line {lineno}: no metric name: {line!r}")
        name, i = m.group(0), m.end()
        labels: Set[str] = set()
        if i < len(line) and line[i] == "{":
            i += 1
            while True:
                while i < len(line) and line[i] in " ,":
                    i += 1
                if i < len(line) and line[i] == "}":
                    i += 1
                    break
                lm = _LABEL_NAME.match(line, i)
                if not lm or line[lm.end():lm.end() + 2] != '="':
                    raise ValueError(f"line {lineno}: bad label at column {i}: {line!r}")
                labels.add(lm.group(0))
                i = lm.end() + 2
                while True:  # the value: \\, \" and \n are its escapes
                    if i >= len(line):
                        raise ValueError(f"line {lineno}: unterminated label value: {line!r}")
                    if line[i] == "\\":
                        if i + 1 >= len(line) or line[i + 1] not in '\\"n':
                            raise ValueError(f"line {lineno}: bad escape: {line!r}")
                        i += 2
                    elif line[i] == '"':
                        i += 1
                        break
                    else:
                        i += 1
        rest = line[i:].split()
        if not rest or len(rest) > 2 or not _FLOAT.match(rest[0]):
            raise ValueError(f"line {lineno}: bad value: {line!r}")
        metrics.setdefault(name, set()).update(labels)
    return {k: frozenset(v) for k, v in metrics.items()}, types


def exported(scrape_text: str) -> Metrics:
    """What Prometheus holds after scraping this text: each series with job and instance, plus
    the synthetic `up`."""
    samples, _ = parse_exposition(scrape_text)
    out = {name: labels | TARGET_LABELS for name, labels in samples.items()}
    out.update(SYNTHETIC)
    return out


# ------------------------------------------------------------------------------------------------
# PromQL: a tokenizer and a parser that works out which label names each subexpression's series
# can carry, reporting what cannot match.


class PromQLSyntaxError(ValueError):
    pass


@dataclass
class Tok:
    kind: str  # str num dur ident op ( ) { } [ ] , : @ var eof
    text: str
    pos: int


_DURATION = re.compile(r"(?:\d+(?:ms|s|m|h|d|w|y))+")
_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_GRAFANA_VAR = re.compile(r"\$(?:\{[^}]*\}|[a-zA-Z_][a-zA-Z0-9_]*)")
_OPS = ("==", "!=", ">=", "<=", "=~", "!~", "=", "<", ">", "+", "-", "*", "/", "%", "^")


def tokenize(expr: str) -> List[Tok]:
    toks: List[Tok] = []
    i, n = 0, len(expr)
    while i < n:
        c = expr[i]
        if c.isspace():
            i += 1
        elif c == "#":  # a comment runs to the end of the line
            while i < n and expr[i] != "\n":
                i += 1
        elif c in "\"'`":
            j = i + 1
            while j < n and expr[j] != c:
                j += 2 if (expr[j] == "\\" and c != "`") else 1
            if j >= n:
                raise PromQLSyntaxError(f"unterminated string at {i}")
            toks.append(Tok("str", expr[i + 1:j], i))
            i = j + 1
        elif c == "$":  # a Grafana variable ($var, ${var}, $__rate_interval)
            m = _GRAFANA_VAR.match(expr, i)
            if not m:
                raise PromQLSyntaxError(f"stray $ at {i}")
            toks.append(Tok("var", m.group(0), i))
            i = m.end()
        elif c.isdigit() or (c == "." and i + 1 < n and expr[i + 1].isdigit()):
            m = _DURATION.match(expr, i)
            if m and not (m.end() < n and (expr[m.end()].isalnum() or expr[m.end()] == "_")):
                toks.append(Tok("dur", m.group(0), i))
            else:
                m = _NUMBER.match(expr, i)
                toks.append(Tok("num", m.group(0), i))
            i = m.end()
        elif c == ":" and toks and toks[-1].kind in ("dur", "var", "["):
            toks.append(Tok(":", ":", i))  # a subquery's [range:step]
            i += 1
        elif c.isalpha() or c in "_:":
            m = _IDENT.match(expr, i)
            word = m.group(0)
            toks.append(Tok("num" if word.lower() in ("inf", "nan") else "ident", word, i))
            i = m.end()
        elif c in "(){}[],:@":
            toks.append(Tok(c, c, i))
            i += 1
        else:
            for op in _OPS:
                if expr.startswith(op, i):
                    toks.append(Tok("op", op, i))
                    i += len(op)
                    break
            else:
                raise PromQLSyntaxError(f"unexpected {c!r} at {i}")
    toks.append(Tok("eof", "", n))
    return toks


AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
_AGG_WITH_PARAM = {"count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
# Functions whose result keeps the labels of their vector argument.
_SAME_LABELS = {
    "abs", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh", "avg_over_time",
    "ceil", "changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh", "count_over_time",
    "day_of_month", "day_of_week", "day_of_year", "days_in_month", "deg", "delta", "deriv", "exp",
    "floor", "histogram_avg", "histogram_count", "histogram_fraction", "histogram_stddev",
    "histogram_stdvar", "histogram_sum", "holt_winters", "hour", "idelta", "increase", "irate",
    "last_over_time", "ln", "log10", "log2", "mad_over_time", "max_over_time", "min_over_time",
    "minute", "month", "predict_linear", "present_over_time", "quantile_over_time", "rad", "rate",
    "resets", "round", "sgn", "sin", "sinh", "sort", "sort_desc", "sqrt", "stddev_over_time",
    "stdvar_over_time", "sum_over_time", "tan", "tanh", "timestamp", "year"}
_OTHER_FUNCTIONS = {"absent", "histogram_quantile", "label_join", "label_replace", "pi", "scalar",
                    "time", "vector"}
_SET_OPS = {"and", "or", "unless"}
_PRECEDENCE = {"or": 1, "and": 2, "unless": 2, "==": 3, "!=": 3, "<=": 3, "<": 3, ">=": 3, ">": 3,
               "+": 4, "-": 4, "*": 5, "/": 5, "%": 5, "atan2": 5, "^": 6}


@dataclass
class Value:
    """What a subexpression yields: a vector (with the label names its series can carry,
    __name__ aside), a scalar or a string."""
    kind: str
    labels: FrozenSet[str] = frozenset()
    string: Optional[str] = None


@dataclass
class Analysis:
    expr: str
    value: Optional[Value] = None
    metrics: Set[str] = field(default_factory=set)  # every metric name selected
    problems: List[str] = field(default_factory=list)
    unknown: Set[str] = field(default_factory=set)  # names not in the metric table


class _Parser:
    def __init__(self, expr: str, metrics: Metrics, analysis: Analysis):
        self.toks = tokenize(expr)
        self.i = 0
        self.metrics = metrics
        self.a = analysis

    # -- tokens --
    def peek(self, k: int = 0) -> Tok:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def take(self, kind: Optional[str] = None, text: Optional[str] = None) -> Tok:
        t = self.peek()
        if (kind and t.kind != kind) or (text and t.text != text):
            want = text or kind
            raise PromQLSyntaxError(f"expected {want!r} at {t.pos}, found {t.text or t.kind!r}")
        self.i += 1
        return t

    def at_word(self, *words: str) -> bool:
        t = self.peek()
        return t.kind == "ident" and t.text.lower() in words

    def problem(self, msg: str) -> None:
        self.a.problems.append(msg)

    def label_list(self) -> List[str]:
        self.take("(")
        names: List[str] = []
        while self.peek().kind != ")":
            t = self.take()
            if t.kind not in ("ident", "str"):
                raise PromQLSyntaxError(f"expected a label name at {t.pos}, found {t.text!r}")
            names.append(t.text)
            if self.peek().kind == ",":
                self.take(",")
        self.take(")")
        return names

    # -- grammar --
    def parse(self) -> Value:
        v = self.expr(0)
        if self.peek().kind != "eof":
            t = self.peek()
            raise PromQLSyntaxError(f"unexpected {t.text!r} at {t.pos}")
        return v

    def binary_op(self) -> Optional[str]:
        t = self.peek()
        if t.kind == "op" and t.text in _PRECEDENCE:
            return t.text
        if t.kind == "ident" and t.text.lower() in ("and", "or", "unless", "atan2"):
            return t.text.lower()
        return None

    def expr(self, min_prec: int) -> Value:
        left = self.unary()
        while True:
            op = self.binary_op()
            if op is None or _PRECEDENCE[op] < min_prec:
                return left
            self.take()
            is_bool = False
            if self.at_word("bool"):
                self.take()
                is_bool = True
            on = ignoring = None
            if self.at_word("on"):
                self.take()
                on = self.label_list()
            elif self.at_word("ignoring"):
                self.take()
                ignoring = self.label_list()
            group, extra = None, []
            if self.at_word("group_left", "group_right"):
                group = self.take().text.lower()
                if self.peek().kind == "(":
                    extra = self.label_list()
            prec = _PRECEDENCE[op]
            right = self.expr(prec if op == "^" else prec + 1)
            left = self.combine(op, left, right, on, ignoring, group, extra, is_bool)

    def unary(self) -> Value:
        t = self.peek()
        if t.kind == "op" and t.text in ("-", "+"):
            self.take()
            return self.unary()
        return self.postfix(self.primary())

    def postfix(self, v: Value) -> Value:
        while True:
            t = self.peek()
            if t.kind == "[":  # a range, or a subquery [range:step]
                self.take("[")
                parts = 0
                while self.peek().kind != "]":
                    p = self.take()
                    if p.kind not in ("dur", "var", ":", "num"):
                        raise PromQLSyntaxError(f"bad range at {p.pos}: {p.text!r}")
                    parts += p.kind != ":"
                self.take("]")
                if parts == 0:
                    raise PromQLSyntaxError(f"empty range at {t.pos}")
            elif t.kind == "ident" and t.text.lower() == "offset":
                self.take()
                if self.peek().kind == "op" and self.peek().text == "-":
                    self.take()
                if self.peek().kind not in ("dur", "var"):
                    raise PromQLSyntaxError(f"expected a duration after offset at {t.pos}")
                self.take()
            elif t.kind == "@":
                self.take()
                if self.at_word("start", "end"):
                    self.take()
                    self.take("(")
                    self.take(")")
                else:
                    self.take("num")
            else:
                return v

    def primary(self) -> Value:
        t = self.peek()
        if t.kind == "num":
            self.take()
            return Value("scalar")
        if t.kind == "str":
            self.take()
            return Value("string", string=t.text)
        if t.kind == "var":  # a Grafana variable standing for a number
            self.take()
            return Value("scalar")
        if t.kind == "(":
            self.take("(")
            v = self.expr(0)
            self.take(")")
            return v
        if t.kind == "{":
            raise PromQLSyntaxError(f"selector without a metric name at {t.pos}")
        if t.kind == "ident":
            word = t.text
            after = self.peek(1)
            if word.lower() in AGGREGATIONS and (
                    after.kind == "(" or (after.kind == "ident"
                                          and after.text.lower() in ("by", "without"))):
                return self.aggregation()
            if self.peek(1).kind == "(":
                return self.call()
            return self.selector()
        raise PromQLSyntaxError(f"unexpected {t.text or t.kind!r} at {t.pos}")

    def selector(self) -> Value:
        name = self.take("ident").text
        matchers: List[str] = []
        if self.peek().kind == "{":
            self.take("{")
            while self.peek().kind != "}":
                lt = self.take()
                if lt.kind not in ("ident", "str"):
                    raise PromQLSyntaxError(f"expected a label name at {lt.pos}")
                op = self.take("op")
                if op.text not in ("=", "!=", "=~", "!~"):
                    raise PromQLSyntaxError(f"bad matcher operator {op.text!r} at {op.pos}")
                self.take("str")
                matchers.append(lt.text)
                if self.peek().kind == ",":
                    self.take(",")
            self.take("}")
        self.a.metrics.add(name)
        if name not in self.metrics:
            self.a.unknown.add(name)
            self.problem(f"metric {name} is not exported")
            return Value("vector", frozenset(matchers) | TARGET_LABELS)
        have = self.metrics[name]
        for label in matchers:
            if label != "__name__" and label not in have:
                self.problem(f"{name} has no label {label!r} (it has {sorted(have)})")
        return Value("vector", have)

    def args(self) -> List[Value]:
        self.take("(")
        out: List[Value] = []
        while self.peek().kind != ")":
            out.append(self.expr(0))
            if self.peek().kind == ",":
                self.take(",")
            elif self.peek().kind != ")":
                t = self.peek()
                raise PromQLSyntaxError(f"expected ',' or ')' at {t.pos}, found {t.text!r}")
        self.take(")")
        return out

    def need(self, labels: Iterable[str], have: FrozenSet[str], where: str) -> None:
        for label in labels:
            if label not in have:
                self.problem(f"{where}: label {label!r} is not on its operand "
                             f"(which has {sorted(have)})")

    def aggregation(self) -> Value:
        op = self.take("ident").text.lower()
        by = without = None
        if self.at_word("by"):
            self.take()
            by = self.label_list()
        elif self.at_word("without"):
            self.take()
            without = self.label_list()
        params = self.args()
        if self.at_word("by") and by is None and without is None:
            self.take()
            by = self.label_list()
        elif self.at_word("without") and by is None and without is None:
            self.take()
            without = self.label_list()
        want = 2 if op in _AGG_WITH_PARAM else 1
        if len(params) != want:
            raise PromQLSyntaxError(f"{op} takes {want} argument(s), got {len(params)}")
        v = params[-1]
        if v.kind != "vector":
            self.problem(f"{op}() of a {v.kind}")
            return Value("vector")
        if by is not None:
            self.need(by, v.labels, f"{op} by ({', '.join(by)})")
            out = frozenset(by)
        elif without is not None:
            self.need(without, v.labels, f"{op} without ({', '.join(without)})")
            out = v.labels - frozenset(without)
        else:
            out = frozenset()
        if op in ("topk", "bottomk", "limitk", "limit_ratio"):
            out = v.labels  # these keep their series whole
        if op == "count_values":
            if params[0].kind != "string":
                raise PromQLSyntaxError("count_values needs a label name string")
            out = out | {params[0].string}
        return Value("vector", out)

    def call(self) -> Value:
        t = self.take("ident")
        name = t.text
        args = self.args()
        vectors = [a for a in args if a.kind == "vector"]
        if name in _SAME_LABELS:
            if not vectors:
                if name in ("day_of_month", "day_of_week", "day_of_year", "days_in_month",
                            "hour", "minute", "month", "year") and not args:
                    return Value("vector")
                self.problem(f"{name}() needs a vector argument")
                return Value("vector")
            return Value("vector", vectors[0].labels)
        if name == "histogram_quantile":
            if len(args) != 2 or args[1].kind != "vector":
                raise PromQLSyntaxError("histogram_quantile(φ, vector)")
            self.need(["le"], args[1].labels, "histogram_quantile")
            return Value("vector", args[1].labels - {"le"})
        if name in ("label_replace", "label_join"):
            if len(args) < 3 or args[0].kind != "vector" or any(
                    a.kind != "string" for a in args[1:]):
                raise PromQLSyntaxError(f"{name}(vector, strings...)")
            dst = args[1].string
            sources = [args[3].string] if name == "label_replace" else [a.string for a in args[3:]]
            if name == "label_replace" and len(args) != 5:
                raise PromQLSyntaxError("label_replace takes 5 arguments")
            self.need([s for s in sources if s], args[0].labels, name)
            if not _LABEL_NAME.fullmatch(dst or ""):
                self.problem(f"{name}: bad destination label {dst!r}")
                return args[0]
            return Value("vector", args[0].labels | {dst})
        if name == "vector":
            return Value("vector")
        if name == "absent":
            return Value("vector")
        if name == "scalar":
            return Value("scalar")
        if name in ("time", "pi"):
            return Value("scalar")
        self.problem(f"unknown function {name}()")
        return Value("vector", vectors[0].labels if vectors else frozenset())

    def combine(self, op: str, left: Value, right: Value, on: Optional[List[str]],
                ignoring: Optional[List[str]], group: Optional[str], extra: List[str],
                is_bool: bool) -> Value:
        if left.kind != "vector" or right.kind != "vector":
            if op in _SET_OPS:
                self.problem(f"'{op}' needs vectors on both sides")
            if left.kind == "vector":
                return left
            return right if right.kind == "vector" else Value("scalar")
        where = f"'{op}'"
        if on is not None:
            self.need(on, left.labels, f"{where} on(...), left side")
            self.need(on, right.labels, f"{where} on(...), right side")
        if ignoring is not None:
            for label in ignoring:
                if label not in left.labels and label not in right.labels:
                    self.problem(f"{where} ignoring({label}): on neither side")
        if op == "or":
            return Value("vector", left.labels | right.labels)
        if on is None:
            ign = frozenset(ignoring or ())
            lkey, rkey = left.labels - ign, right.labels - ign
            if lkey != rkey:
                self.problem(
                    f"{where}: the two sides cannot match (only left {sorted(lkey - rkey)}, "
                    f"only right {sorted(rkey - lkey)}); use on() or ignoring()")
        if op in _SET_OPS:
            return left
        if group == "group_left":
            self.need(extra, right.labels, f"{where} group_left({', '.join(extra)})")
            return Value("vector", left.labels | frozenset(extra))
        if group == "group_right":
            self.need(extra, left.labels, f"{where} group_right({', '.join(extra)})")
            return Value("vector", right.labels | frozenset(extra))
        if on is not None:
            return Value("vector", frozenset(on))
        if ignoring is not None:
            return Value("vector", left.labels - frozenset(ignoring))
        return left


def analyze(expr: str, metrics: Metrics) -> Analysis:
    """Parses `expr` and checks it against the metric table; syntax errors become problems."""
    a = Analysis(expr)
    try:
        a.value = _Parser(expr, metrics, a).parse()
    except PromQLSyntaxError as e:
        a.problems.append(f"syntax: {e}")
    return a


_LEGEND_LABEL = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")
_TEMPLATE_LABEL = re.compile(r"\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.*?)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$",
                           re.S)


def _short(expr: str) -> str:
    one = " ".join(expr.split())
    return one if len(one) <= 140 else one[:137] + "..."


# ------------------------------------------------------------------------------------------------
# The checks, each on a file path


def dashboard_queries(path: Path) -> List[Tuple[str, str, str]]:
    """(where, expr, legendFormat) for every panel target and variable query of the dashboard
    (panels nested in collapsed rows included)."""
    d = json.loads(path.read_text())
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if "expr" in t:
                    out.append((f"panel {p.get('title')!r} target {t.get('refId')}",
                                t["expr"], t.get("legendFormat", "")))
            walk(p.get("panels", []))

    walk(d.get("panels", []))
    for v in d.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v.get("query")
            q = q.get("query", "") if isinstance(q, dict) else q
            out.append((f"variable {v.get('name')!r}", q, ""))
    return out


def check_dashboard_queries(path: Path, metrics: Metrics) -> List[str]:
    problems = []
    for where, expr, legend in dashboard_queries(path):
        m = _LABEL_VALUES.match(expr)
        if m:  # label_values(selector, label)
            a = analyze(m.group(1), metrics)
            if a.value is not None and a.value.kind == "vector":
                if m.group(2) not in a.value.labels:
                    a.problems.append(f"label_values: no label {m.group(2)!r}")
        elif expr.strip().startswith("label_values("):
            problems.append(f"{where}: label_values() without a selector: {expr}")
            continue
        else:
            a = analyze(expr, metrics)
        for p in a.problems:
            problems.append(f"{where}: {p}  [{_short(expr)}]")
        if a.value is not None and a.value.kind == "vector":
            for label in _LEGEND_LABEL.findall(legend):
                if label not in a.value.labels:
                    problems.append(f"{where}: legend {{{{{label}}}}} is not a label of the "
                                    f"result {sorted(a.value.labels)}  [{_short(expr)}]")
    return problems


def load_rules(path: Path) -> List[dict]:
    doc = yaml.safe_load(path.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def rule_outputs(path: Path, metrics: Metrics) -> Tuple[Metrics, Dict[str, Analysis]]:
    """Adds every recording rule's output to a copy of `metrics` (its expression's labels plus
    the rule's own), resolving rules that use others in any order. Returns the table and the
    analysis of each rule (keyed by record or alert name)."""
    table = dict(metrics)
    rules = load_rules(path)
    records = {r["record"]: r for r in rules if "record" in r}
    done: Dict[str, Analysis] = {}
    pending = list(records)
    while pending:
        progress = False
        for name in list(pending):
            r = records[name]
            a = analyze(r["expr"], table)
            if a.unknown & (set(pending) - {name}):
                continue  # uses a record not worked out yet
            labels = (a.value.labels if a.value is not None and a.value.kind == "vector"
                      else frozenset())
            table[name] = labels | frozenset((r.get("labels") or {}).keys())
            done[name] = a
            pending.remove(name)
            progress = True
        if not progress:  # a cycle, or records that use one another: report them as they are
            for name in pending:
                done[name] = analyze(records[name]["expr"], table)
            break
    for r in rules:
        if "alert" in r:
            done[r["alert"]] = analyze(r["expr"], table)
    return table, done


def check_rules_queries(path: Path, metrics: Metrics) -> List[str]:
    problems = []
    _, analyses = rule_outputs(path, metrics)
    rules = {r.get("record") or r.get("alert"): r for r in load_rules(path)}
    for name, a in analyses.items():
        for p in a.problems:
            problems.append(f"rule {name}: {p}  [{_short(a.expr)}]")
        r = rules[name]
        if "alert" in r and a.value is not None:
            have = (a.value.labels if a.value.kind == "vector" else frozenset()) | frozenset(
                (r.get("labels") or {}).keys())
            for text in (r.get("annotations") or {}).values():
                for label in _TEMPLATE_LABEL.findall(text):
                    if label not in have:
                        problems.append(f"alert {name}: annotation uses $labels.{label}, not a "
                                        f"label of the alert {sorted(have)}")
    return problems


def check_rule_conventions(path: Path) -> List[str]:
    """Recording rules named level:metric:operations; alerts with for, a severity and a summary
    and description that name the policy when the alert has one."""
    problems = []
    names = set()
    for r in load_rules(path):
        name = r.get("record") or r.get("alert")
        if name in names:
            problems.append(f"{name}: defined twice")
        names.add(name)
        if "record" in r:
            parts = r["record"].split(":")
            if len(parts) != 3 or not all(parts):
                problems.append(f"record {r['record']}: not level:metric:operations")
            elif parts[1].endswith("_total") and "rate" in parts[2]:
                problems.append(f"record {r['record']}: a rated counter drops _total")
            continue
        if not r.get("for"):
            problems.append(f"alert {name}: no for:")
        if (r.get("labels") or {}).get("severity") not in ("critical", "warning", "info"):
            problems.append(f"alert {name}: severity must be critical, warning or info")
        ann = r.get("annotations") or {}
        for key in ("summary", "description"):
            if not ann.get(key):
                problems.append(f"alert {name}: no {key} annotation")
        if "policy" in r["expr"] or "sluice_fleet" in r["expr"] or "_throttler_" in r["expr"]:
            for key in ("summary", "description"):
                if "$labels.policy" not in ann.get(key, ""):
                    problems.append(f"alert {name}: {key} does not name the policy")
    return problems


def check_rule_tests_cover_alerts(rules_path: Path, tests_path: Path) -> List[str]:
    """Each alert of the rules file has a promtool case where it fires and one where it must
    not (an eval with exp_alerts empty)."""
    alerts = [r["alert"] for r in load_rules(rules_path) if "alert" in r]
    doc = yaml.safe_load(tests_path.read_text())
    fires: Set[str] = set()
    silent: Set[str] = set()
    for test in doc.get("tests", []):
        for case in test.get("alert_rule_test", []) or []:
            (fires if case.get("exp_alerts") else silent).add(case["alertname"])
    problems = []
    for a in alerts:
        if a not in fires:
            problems.append(f"alert {a}: no test case where it fires")
        if a not in silent:
            problems.append(f"alert {a}: no test case where it must not fire")
    for a in (fires | silent) - set(alerts):
        problems.append(f"test cases for {a}, which the rules do not define")
    return problems


def row_kinds(path: Path) -> Dict[str, List[str]]:
    """{row title: the policy kinds it names}: a row names its kinds as `kind: x` or
    `kinds: x, y` in its title."""
    d = json.loads(path.read_text())
    out = {}
    for p in d.get("panels", []):
        if p.get("type") == "row":
            title = p.get("title", "")
            m = re.search(r"\bkinds?: ([a-z_, ]+)", title)
            out[title] = [k.strip() for k in m.group(1).split(",")] if m else []
    return out


def check_dashboard_structure(path: Path, kinds: Iterable[str]) -> List[str]:
    problems = []
    try:
        d = json.loads(path.read_text())
    except ValueError as e:
        return [f"not JSON: {e}"]
    for key in ("title", "uid", "panels", "templating", "schemaVersion"):
        if key not in d:
            problems.append(f"no top-level {key!r}")
    variables = {v.get("name"): v for v in d.get("templating", {}).get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        problems.append("no `datasource` variable of type datasource (query prometheus)")
    for name in ("job", "instance"):
        v = variables.get(name)
        if not v or v.get("type") != "query":
            problems.append(f"no {name!r} query variable")
        elif (v.get("datasource") or {}).get("uid") != "${datasource}":
            problems.append(f"variable {name!r} does not use ${{datasource}}")
    ids: Set[int] = set()
    panels = []

    def walk(ps):
        for p in ps:
            panels.append(p)
            walk(p.get("panels", []))

    walk(d.get("panels", []))
    for p in panels:
        title = p.get("title") or "(untitled)"
        pid = p.get("id")
        if pid in ids:
            problems.append(f"panel {title!r}: id {pid} used twice")
        ids.add(pid)
        g = p.get("gridPos") or {}
        if not all(isinstance(g.get(k), int) for k in ("h", "w", "x", "y")):
            problems.append(f"panel {title!r}: no gridPos")
        elif g["x"] + g["w"] > 24:
            problems.append(f"panel {title!r}: wider than the grid")
        if p.get("type") == "row":
            continue
        if (p.get("datasource") or {}).get("uid") != "${datasource}":
            problems.append(f"panel {title!r}: datasource is not ${{datasource}}")
        targets = p.get("targets") or []
        if not targets:
            problems.append(f"panel {title!r}: no targets")
        for t in targets:
            if not (t.get("expr") or "").strip():
                problems.append(f"panel {title!r}: target {t.get('refId')} has no expr")
            if (t.get("datasource") or {}).get("uid") not in (None, "${datasource}"):
                problems.append(f"panel {title!r}: target {t.get('refId')} on another datasource")
        if len({t.get("refId") for t in targets}) != len(targets):
            problems.append(f"panel {title!r}: refIds repeat")
        for t in targets:
            if not re.search(r'job=~"\$job"', t.get("expr", "")) or not re.search(
                    r'instance=~"\$instance"', t.get("expr", "")):
                problems.append(f"panel {title!r}: target {t.get('refId')} does not filter on "
                                f"$job and $instance")
    covered = {k for ks in row_kinds(path).values() for k in ks}
    for kind in kinds:
        if kind not in covered:
            problems.append(f"no row for kind {kind!r} (rows: {sorted(row_kinds(path))})")
    return problems


def promtool() -> Optional[str]:
    found = shutil.which("promtool")
    if found is None and os.environ.get("SLUICE_REQUIRE_PROMTOOL") == "1":
        pytest.fail("promtool is not installed (apt-get install --no-install-recommends "
                    "prometheus) and SLUICE_REQUIRE_PROMTOOL=1")
    return found


def run_promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    tool = promtool()
    if tool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    return subprocess.run([tool, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


# ------------------------------------------------------------------------------------------------
# The tests


@pytest.fixture(scope="session")
def metrics(scrape: str) -> Metrics:
    return exported(scrape)


def test_the_server_exports_every_kind(scrape):
    """The scraped server runs a policy of each kind, so the checks below see every family."""
    samples, types = parse_exposition(scrape)
    kinds = set(re.findall(r'^sluice_policy_info\{[^}]*kind="([a-z_]+)"', scrape, re.M))
    assert kinds == set(KINDS)
    assert types["sluice_coordinator_call_seconds"] == "histogram"
    assert "le" in samples["sluice_coordinator_call_seconds_bucket"]
    assert "sluice_coordinator_call_seconds" not in samples


def test_a_failed_throttler_sample_is_exported_as_nan(scrape):
    """SluiceThrottlerProbeFailing selects NaN samples (x != x): the server must export a failed
    probe's sample that way, and a working one's as a number."""
    values = dict(re.findall(r'^sluice_throttler_metric_value\{[^}]*metric="([a-z]+)"[^}]*\} (\S+)$',
                             scrape, re.M))
    assert math.isnan(float(values["broken"]))
    assert float(values["depth"]) == 7


def test_dashboard_queries_use_exported_metrics_and_labels(metrics):
    queries = dashboard_queries(DASHBOARD)
    assert len(queries) > 50
    assert check_dashboard_queries(DASHBOARD, metrics) == []


def test_rules_use_exported_metrics_and_labels(metrics):
    table, analyses = rule_outputs(RULES, metrics)
    assert any(":" in name for name in analyses)  # recording rules were worked out
    assert check_rules_queries(RULES, metrics) == []


def test_rule_conventions():
    assert check_rule_conventions(RULES) == []


def test_every_alert_is_tested_both_ways():
    assert check_rule_tests_cover_alerts(RULES, RULES_TEST) == []


def test_dashboard_structure(scrape):
    kinds = set(re.findall(r'^sluice_policy_info\{[^}]*kind="([a-z_]+)"', scrape, re.M))
    assert check_dashboard_structure(DASHBOARD, kinds) == []


def test_promtool_check_rules():
    r = run_promtool("check", "rules", str(RULES), cwd=RULES.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_promtool_test_rules():
    r = run_promtool("test", "rules", RULES_TEST.name, cwd=RULES_TEST.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


# -- the checks catch breakage ---------------------------------------------------------------


def _broken_dashboard(tmp_path: Path, edit) -> Path:
    d = json.loads(DASHBOARD.read_text())
    edit(d)
    out = tmp_path / "sluice.json"
    out.write_text(json.dumps(d))
    return out


def _all_panels(d: dict) -> List[dict]:
    return [p for p in d["panels"] if p.get("type") != "row"]


def test_a_renamed_metric_in_the_dashboard_is_caught(tmp_path, metrics):
    def rename(d):
        for p in _all_panels(d):
            for t in p["targets"]:
                t["expr"] = t["expr"].replace("sluice_fleet_l_global", "sluice_fleet_lglobal")

    broken = _broken_dashboard(tmp_path, rename)
    problems = check_dashboard_queries(broken, metrics)
    assert problems, "a dashboard selecting a metric the server does not export passed"
    assert all("sluice_fleet_lglobal" in p for p in problems), problems
    assert any("metric sluice_fleet_lglobal is not exported" in p for p in problems)


def test_a_wrong_label_in_the_dashboard_is_caught(tmp_path, metrics):
    def relabel(d):
        for p in _all_panels(d):
            if p["title"] == "Refusals by reason":
                p["targets"][0]["expr"] = p["targets"][0]["expr"].replace(
                    "by (policy, reason)", "by (policy, reasons)")

    problems = check_dashboard_queries(_broken_dashboard(tmp_path, relabel), metrics)
    assert any("'reasons' is not on its operand" in p for p in problems), problems
    # the legend names a label the broken query no longer keeps
    assert any("legend {{reason}}" in p for p in problems), problems


def test_a_histogram_without_its_suffix_is_caught(tmp_path, metrics):
    def strip(d):
        for p in _all_panels(d):
            for t in p["targets"]:
                t["expr"] = t["expr"].replace("sluice_coordinator_call_seconds_bucket",
                                              "sluice_coordinator_call_seconds")

    problems = check_dashboard_queries(_broken_dashboard(tmp_path, strip), metrics)
    assert any("metric sluice_coordinator_call_seconds is not exported" in p for p in problems)


def test_a_broken_dashboard_structure_is_caught(tmp_path):
    def damage(d):
        panels = _all_panels(d)
        del panels[0]["datasource"]
        panels[1]["targets"] = []
        panels[2]["targets"][0]["expr"] = " "
        d["panels"] = [p for p in d["panels"] if "kind: throttler" not in p.get("title", "")]

    problems = check_dashboard_structure(_broken_dashboard(tmp_path, damage), KINDS)
    assert any("datasource is not ${datasource}" in p for p in problems), problems
    assert any(": no targets" in p for p in problems), problems
    assert any("has no expr" in p for p in problems), problems
    assert any("no row for kind 'throttler'" in p for p in problems), problems


def _broken_rules(tmp_path: Path, old: str, new: str) -> Path:
    text = RULES.read_text()
    assert old in text, old
    out = tmp_path / RULES.name
    out.write_text(text.replace(old, new, 1))
    shutil.copy(RULES_TEST, tmp_path / RULES_TEST.name)
    return out


def test_a_wrong_label_in_the_rules_is_caught(tmp_path, metrics):
    broken = _broken_rules(tmp_path, 'reason="coordinator_unreachable"',
                           'cause="coordinator_unreachable"')
    problems = check_rules_queries(broken, metrics)
    assert any(p.startswith("rule SluiceFederatedCoordinatorUnreachable:")
               and "no label 'cause'" in p for p in problems), problems


def test_an_annotation_naming_a_dropped_label_is_caught(tmp_path, metrics):
    broken = _broken_rules(
        tmp_path,
        "max by (job, instance, policy) (sluice_federated_in_outage) == 1",
        "max by (job, instance) (sluice_federated_in_outage) == 1")
    problems = check_rules_queries(broken, metrics)
    assert any("SluiceFederatedRegionalOnlyOutage: annotation uses $labels.policy" in p
               for p in problems), problems


def test_a_renamed_record_is_caught(tmp_path, metrics):
    # The throttler alert reads a recorded series: renaming the record breaks it.
    broken = _broken_rules(tmp_path,
                           "record: instance_policy_app:sluice_throttler_refused:ratio_rate5m",
                           "record: instance_policy_app:sluice_throttler_refusals:ratio_rate5m")
    problems = check_rules_queries(broken, metrics)
    assert any(p.startswith("rule SluiceThrottlerHoldingBackApp:") and "not exported" in p
               for p in problems), problems


def test_an_untested_alert_is_caught(tmp_path):
    doc = yaml.safe_load(RULES_TEST.read_text())
    for test in doc["tests"]:
        test["alert_rule_test"] = [c for c in test.get("alert_rule_test", [])
                                   if c["alertname"] != "SluiceCascadeNoClosedBreaker"
                                   or not c.get("exp_alerts")]
    broken = tmp_path / "rules.test.yml"
    broken.write_text(yaml.safe_dump(doc))
    assert check_rule_tests_cover_alerts(RULES, broken) == [
        "alert SluiceCascadeNoClosedBreaker: no test case where it fires"]


def test_promtool_catches_an_alert_that_no_longer_fires(tmp_path):
    broken = _broken_rules(tmp_path, "sum by (job, instance, policy) (sluice_cascade_node_breaker_state"
                                     "{state=\"closed\"}) == 0",
                           "sum by (job, instance, policy) (sluice_cascade_node_breaker_state"
                           "{state=\"closed\"}) < 0")
    r = run_promtool("test", "rules", RULES_TEST.name, cwd=broken.parent)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "SluiceCascadeNoClosedBreaker" in r.stdout + r.stderr


# -- the PromQL analysis itself ---------------------------------------------------------------

_TABLE: Metrics = {
    "a_total": frozenset({"job", "instance", "policy", "reason"}),
    "b": frozenset({"job", "instance", "policy"}),
    "h_bucket": frozenset({"job", "instance", "policy", "le"}),
    "up": TARGET_LABELS,
}


@pytest.mark.parametrize("expr, labels", [
    ('sum by (policy) (rate(a_total{reason="x"}[5m]))', {"policy"}),
    ('sum(rate(a_total[$__rate_interval])) by (policy, reason)', {"policy", "reason"}),
    ('sum without (reason) (a_total) / b', {"job", "instance", "policy"}),
    ('a_total / ignoring (reason) group_left b', {"job", "instance", "policy", "reason"}),
    ('b + on (job, instance, policy) group_left (reason) a_total',
     {"job", "instance", "policy", "reason"}),
    ('b * on (policy) sum by (policy) (a_total)', {"policy"}),
    ('histogram_quantile(0.9, sum by (le, policy) (rate(h_bucket[5m])))', {"policy"}),
    ('label_replace(b, "dst", "$1", "policy", "(.*)")', {"job", "instance", "policy", "dst"}),
    ('max_over_time(b[10m:1m] offset 5m) > bool 3', {"job", "instance", "policy"}),
    ('count_values("v", b)', {"v"}),
    ('topk(3, b)', {"job", "instance", "policy"}),
    ('# a comment\n  b{policy=~"$policy", instance=~"${instance}"} and on() vector(1)',
     {"job", "instance", "policy"}),
    ('b{policy="with {braces}, by (x) and \\"quotes\\""} - 1', {"job", "instance", "policy"}),
    ('up == 0 or b', {"job", "instance", "policy"}),
])
def test_analysis_result_labels(expr, labels):
    a = analyze(expr, _TABLE)
    assert a.problems == []
    assert a.value.kind == "vector" and a.value.labels == frozenset(labels)


@pytest.mark.parametrize("expr, problem", [
    ("missing_metric", "metric missing_metric is not exported"),
    ('b{reason="x"}', "b has no label 'reason'"),
    ("sum by (reason) (b)", "label 'reason' is not on its operand"),
    ("sum without (le) (b)", "label 'le' is not on its operand"),
    ("a_total / b", "the two sides cannot match"),
    ("a_total and b", "the two sides cannot match"),
    ("b / on (reason) a_total", "on(...), left side: label 'reason'"),
    ("b * on (policy) group_left (le) a_total", "group_left(le): label 'le'"),
    ("histogram_quantile(0.5, sum by (policy) (rate(h_bucket[5m])))",
     "histogram_quantile: label 'le'"),
    ('label_replace(b, "d", "$1", "reason", "(.*)")', "label_replace: label 'reason'"),
    ("ratee(b[5m])", "unknown function ratee()"),
    ("sum(b", "syntax:"),
    ('b{policy="x}', "syntax:"),
    ("rate(b[])", "syntax:"),
])
def test_analysis_problems(expr, problem):
    a = analyze(expr, _TABLE)
    assert any(problem in p for p in a.problems), a.problems


def test_exposition_parser():
    text = ('# HELP x_total A counter\n# TYPE x_total counter\n'
            'x_total{a="1",b="q\\"uote, and {brace}"} 3\n'
            'x_total{a="2",c="new\\nline"} 4 1700000000000\n'
            'y NaN\n# TYPE z gauge\n')
    samples, types = parse_exposition(text)
    assert samples == {"x_total": frozenset({"a", "b", "c"}), "y": frozenset()}
    assert types == {"x_total": "counter", "z": "gauge"}
    for bad in ('x{a="1} 3', "x{a=1} 3", "x 3 4 5", "x{a=\"1\"} three"):
        with pytest.raises(ValueError):
            parse_exposition(bad)
