#!/usr/bin/env python3
"""Generate src/proto/schema.txt: the protobuf schema table of the Kubernetes API.

The table tells the Rust side how to transcode the JSON objects the apiserver
sends into the exact protobuf bytes the apiserver itself would produce (the
gogo-protobuf generated Marshal code of k8s.io/api and friends).

Sources (bare git mirrors, read with `git cat-file`, nothing is checked out):
  k8s.io/api, k8s.io/apimachinery, k8s.io/apiextensions-apiserver,
  k8s.io/kube-aggregator, all at one tag (default v0.36.3).

For every message of every generated.proto the table lists the fields in
ascending field number order, with the JSON member name, the proto type and
the cardinality, which is derived from the Go field type the way gogo's
generated Marshal treats it:

  one  non-pointer scalar or struct: always written (even zero/empty)
  opt  pointer (scalar or struct), a []byte, or a named slice type that has
       its own message (e.g. ExtraValue): written only when non-nil
  rep  slice: one field per element (proto2, never packed)
  map  one entry (key = field 1, value = field 2) per key, keys sorted

`inline` marks a field whose struct is a nested message in protobuf but whose
members are inlined into the parent object in JSON (`json:",inline"` plus a
protobuf tag). `array` marks a message whose Go type is a named slice (its
JSON form is a plain array; field 1 `items` holds the elements). `special`
marks a message whose protobuf Marshal is hand-written or whose JSON form is
custom (MarshalJSON/UnmarshalJSON): its fields are listed but the Rust side
has to special-case it.

Name column: the JSON member name from the json tag (e.g. `$ref`,
`x-kubernetes-preserve-unknown-fields`); for an `inline` field, which has no
JSON member, the protobuf name stands in (e.g. `volumeSource`); in a
`special` message, whose JSON form is custom, it is the protobuf field name.
Fields with a protobuf tag but `json:"-"` are left out (and reported) unless
their message is special. In a special message whose Go struct lacks the
proto fields (Time, MicroTime via Timestamp; Quantity), the fields are taken
from generated.proto: scalars `one` (the hand-written Marshal always writes
them), messages `opt`.

`omitempty` (after `inline`) marks a `[]byte` field whose json tag has
`omitempty`: Go's JSON leaves it out both when nil and when empty, while the
generated Marshal writes an empty one (`if m.X != nil`), so the JSON does not
say what the protobuf holds when the member is absent.

`since=<minor>` (last token, after `omitempty`) marks a field that the v0.28.0
release of its repository does not have in the generated.proto of its package
(so a Kubernetes 1.28 apiserver never writes it): <minor> is the smallest N in
28..36 whose tag v0.N.0 (else the newest v0.N.x) has that message with a field
of that number. Only generated.proto is read at those older tags; a message
new after 1.28 gets since= on each of its fields. The tags used are listed in
a header comment.

Map values: a message value is always written (even when empty); a bytes
value is left out when nil (gogo: `if v != nil`).

If a mirror lacks the tag (the kube-aggregator mirror may predate it), the
newest earlier patch release of the same minor version is used, with a
warning on stderr and a comment line in the output.

Cross-checks (any failure: message on stderr, exit status 1):
  1. every message and every field of every generated.proto is in the table
     with the same number, and the table has no field generated.proto lacks;
  2. the proto type agrees with the Go type class, the proto label with the
     cardinality;
  3. in generated.pb.go every MarshalToSizedBuffer agrees with the one/opt/
     rep/map classification (opt: under `if m.X != nil`; rep and map: under
     `if len(m.X) > 0`; one: unguarded) and writes the field under the key
     (field number) the table says.

Only the Python 3 standard library is used. Output is deterministic.
"""

import argparse
import os
import re
import subprocess
import sys
from collections import defaultdict

DEFAULT_TAG = "v0.36.3"
# since=<minor>: the Kubernetes minor versions compared (the oldest one is the
# baseline: its fields get no since= token).
SINCE_MINORS = list(range(28, 37))
MIRRORS = "/work/.mirror"
REPOS = [
    # (key, go module path, default mirror dir)
    ("api", "k8s.io/api", MIRRORS + "/kubernetes+api/repo"),
    ("apimachinery", "k8s.io/apimachinery", MIRRORS + "/kubernetes+apimachinery/repo"),
    ("apiextensions", "k8s.io/apiextensions-apiserver", MIRRORS + "/kubernetes+apiextensions-apiserver/repo"),
    ("aggregator", "k8s.io/kube-aggregator", MIRRORS + "/kubernetes+kube-aggregator/repo"),
]

# apimachinery packages whose generated.proto are part of the table
# (pkg/apis/testapigroup is a test fixture no apiserver serves: left out).
APIMACHINERY_PKGS = [
    "pkg/apis/meta/v1",
    "pkg/apis/meta/v1beta1",
    "pkg/runtime",
    "pkg/runtime/schema",
    "pkg/api/resource",
    "pkg/util/intstr",
]

# Messages the brief requires to be special (asserted to be detected).
REQUIRED_SPECIAL = [
    "k8s.io.apimachinery.pkg.apis.meta.v1.Time",
    "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime",
    "k8s.io.apimachinery.pkg.apis.meta.v1.Duration",
    "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1",
    "k8s.io.apimachinery.pkg.runtime.RawExtension",
    "k8s.io.apimachinery.pkg.runtime.Unknown",
    "k8s.io.apimachinery.pkg.api.resource.Quantity",
    "k8s.io.apimachinery.pkg.util.intstr.IntOrString",
] + [
    "k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.%s.%s" % (v, n)
    for v in ("v1", "v1beta1")
    for n in ("JSON", "JSONSchemaPropsOrArray", "JSONSchemaPropsOrBool", "JSONSchemaPropsOrStringArray")
]

PROTO_SCALARS = {"string", "bool", "int32", "int64", "uint32", "uint64", "double", "float", "bytes",
                 "sint32", "sint64", "fixed32", "fixed64", "sfixed32", "sfixed64"}
OUT_SCALARS = {"string", "bool", "int32", "int64", "uint32", "uint64", "double", "float", "bytes"}

# Go basic kinds accepted for each proto scalar type.
PROTO_GO = {
    "string": {"string"},
    "bool": {"bool"},
    "int32": {"int32"},
    "int64": {"int64", "int"},
    "uint32": {"uint32"},
    "uint64": {"uint64", "uint"},
    "double": {"float64"},
    "float": {"float32"},
}

GO_BASIC = {"string", "bool", "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16",
            "uint32", "uint64", "uintptr", "float32", "float64", "complex64", "complex128", "byte", "rune"}

errors = []
notes = []


def fail(msg):
    errors.append(msg)


def warn(msg):
    print("protoschema: " + msg, file=sys.stderr)


# ---------------------------------------------------------------- git access

class Repo:
    def __init__(self, key, module, gitdir, tag):
        self.key, self.module, self.gitdir = key, module, gitdir
        self.requested = tag
        self.tag = self._pick_tag(tag)
        self.commit = self._git("rev-parse", self.tag + "^{commit}").strip()
        self._cat = None
        self._tree = None

    def _git(self, *args):
        return subprocess.run(["git", "-C", self.gitdir] + list(args), check=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE).stdout.decode()

    def _pick_tag(self, tag):
        tags = set(self._git("tag", "--list").split())
        if tag in tags:
            return tag
        # The mirror may predate the tag: fall back, loudly, to the newest
        # earlier patch release of the same minor version.
        m = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)", tag)
        if not m:
            raise SystemExit("protoschema: %s: no tag %s" % (self.gitdir, tag))
        cands = []
        for t in tags:
            mm = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)", t)
            if mm and mm.group(1, 2) == m.group(1, 2) and int(mm.group(3)) < int(m.group(3)):
                cands.append((int(mm.group(3)), t))
        if not cands:
            raise SystemExit("protoschema: %s: no tag %s (nor an earlier patch release)" % (self.gitdir, tag))
        got = max(cands)[1]
        warn("WARNING: %s has no tag %s in %s; using %s instead" % (self.module, tag, self.gitdir, got))
        notes.append("%s: no tag %s in the mirror, %s used" % (self.module, tag, got))
        return got

    def tree(self):
        if self._tree is None:
            self._tree = set(self._git("ls-tree", "-r", "--name-only", self.commit).split("\n")) - {""}
        return self._tree

    def ls(self, d):
        d = d.rstrip("/") + "/"
        return sorted(p for p in self.tree() if p.startswith(d) and "/" not in p[len(d):])

    def read(self, path):
        if self._cat is None:
            self._cat = subprocess.Popen(["git", "-C", self.gitdir, "cat-file", "--batch"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._cat.stdin.write(("%s:%s\n" % (self.commit, path)).encode())
        self._cat.stdin.flush()
        header = self._cat.stdout.readline().decode()
        parts = header.split()
        if len(parts) != 3 or parts[1] != "blob":
            raise SystemExit("protoschema: %s: cannot read %s:%s (%s)" % (self.gitdir, self.tag, path, header.strip()))
        size = int(parts[2])
        data = self._cat.stdout.read(size)
        self._cat.stdout.read(1)
        return data.decode("utf-8")


class TagReader(Repo):
    """Read access to an older tag of the same mirror (for the since= column)."""

    def __init__(self, base, tag):
        self.key, self.module, self.gitdir = base.key, base.module, base.gitdir
        self.requested = self.tag = tag
        self.commit = self._git("rev-parse", tag + "^{commit}").strip()
        self._cat = None
        self._tree = None


def since_tag(repo, minor):
    """v0.<minor>.0 of repo's mirror, else its newest v0.<minor>.x tag, else None."""
    tags = set(repo._git("tag", "--list").split())
    if "v0.%d.0" % minor in tags:
        return "v0.%d.0" % minor
    cands = []
    for t in tags:
        mm = re.fullmatch(r"v0\.(\d+)\.(\d+)", t)
        if mm and int(mm.group(1)) == minor:
            cands.append((int(mm.group(2)), t))
    return max(cands)[1] if cands else None


# ------------------------------------------------------------ proto parsing

class ProtoField:
    def __init__(self, label, typ, name, number, key=None, val=None):
        self.label, self.type, self.name, self.number = label, typ, name, number
        self.key, self.val = key, val  # map key/value types


class ProtoFile:
    def __init__(self, path, text):
        self.path = path
        self.package = None
        self.go_package = None
        self.messages = {}  # name -> [ProtoField]
        self._parse(text)

    def _parse(self, text):
        text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
        text = re.sub(r"//[^\n]*", "", text)
        cur = None
        for raw in text.split("\n"):
            line = raw.strip()
            if not line:
                continue
            if cur is None:
                m = re.fullmatch(r"package\s+([\w.]+)\s*;", line)
                if m:
                    self.package = m.group(1)
                    continue
                m = re.fullmatch(r'option\s+go_package\s*=\s*"([^"]+)"\s*;', line)
                if m:
                    self.go_package = m.group(1)
                    continue
                if re.fullmatch(r'(syntax\s*=\s*"proto2"|import\s+"[^"]+"|option\s+.*)\s*;', line):
                    continue
                m = re.fullmatch(r"message\s+(\w+)\s*\{(\s*\})?", line)
                if m:
                    if m.group(1) in self.messages:
                        raise SystemExit("protoschema: %s: message %s twice" % (self.path, m.group(1)))
                    self.messages[m.group(1)] = []
                    if not m.group(2):
                        cur = m.group(1)
                    continue
                raise SystemExit("protoschema: %s: unexpected line: %s" % (self.path, line))
            else:
                if line == "}":
                    cur = None
                    continue
                m = re.fullmatch(r"(optional|repeated)\s+([\w.]+)\s+(\w+)\s*=\s*(\d+)\s*(\[[^\]]*\])?\s*;", line)
                if m:
                    self.messages[cur].append(ProtoField(m.group(1), m.group(2), m.group(3), int(m.group(4))))
                    continue
                m = re.fullmatch(r"map\s*<\s*([\w.]+)\s*,\s*([\w.]+)\s*>\s+(\w+)\s*=\s*(\d+)\s*;", line)
                if m:
                    self.messages[cur].append(ProtoField("map", None, m.group(3), int(m.group(4)),
                                                         m.group(1), m.group(2)))
                    continue
                if re.fullmatch(r"(reserved|option)\b.*;", line):
                    continue
                raise SystemExit("protoschema: %s: unexpected line in message %s: %s" % (self.path, cur, line))
        if cur is not None or not self.package:
            raise SystemExit("protoschema: %s: cannot parse" % self.path)

    def resolve(self, t):
        """Full name of a type reference (scalar names stay as they are)."""
        if t in PROTO_SCALARS:
            return t
        if t.startswith("."):
            return t[1:]
        # k8s protos have no nested messages: a relative name is in this package
        return self.package + "." + t


# ------------------------------------------------------------- Go parsing

KEYWORDS = {"break", "case", "chan", "const", "continue", "default", "defer", "else", "fallthrough",
            "for", "func", "go", "goto", "if", "import", "interface", "map", "package", "range",
            "return", "select", "struct", "switch", "type", "var"}

TOKEN_RE = re.compile(r"""
    (?P<nl>\n)
  | (?P<ws>[ \t\r\f]+)
  | (?P<lc>//[^\n]*)
  | (?P<bc>/\*.*?\*/)
  | (?P<raw>`[^`]*`)
  | (?P<str>"(?:\\.|[^"\\\n])*")
  | (?P<rune>'(?:\\.|[^'\\\n])+')
  | (?P<num>\.?[0-9](?:[eEpP][+-]|[0-9a-zA-Z_.])*)
  | (?P<ident>[^\W\d]\w*)
  | (?P<op><<=|>>=|&\^=|\.\.\.|&&|\|\||<-|\+\+|--|==|!=|<=|>=|:=|\+=|-=|\*=|/=|%=|&=|\|=|\^=|<<|>>|&\^|[-+*/%&|^<>=!~()\[\]{},;.:])
""", re.X | re.S)


class Tok:
    __slots__ = ("kind", "val")

    def __init__(self, kind, val):
        self.kind, self.val = kind, val

    def __repr__(self):
        return "%s:%r" % (self.kind, self.val)


def tokenize(src, fname):
    toks = []
    pos = 0
    n = len(src)

    def need_semi():
        if not toks:
            return False
        t = toks[-1]
        if t.kind in ("ident", "num", "str", "rune"):
            return t.val not in KEYWORDS or t.val in ("break", "continue", "fallthrough", "return")
        return t.kind == "op" and t.val in ("++", "--", ")", "]", "}")

    while pos < n:
        m = TOKEN_RE.match(src, pos)
        if not m:
            raise SystemExit("protoschema: %s: cannot tokenize at %r" % (fname, src[pos:pos + 40]))
        kind = m.lastgroup
        val = m.group(kind)
        pos = m.end()
        if kind == "nl" or (kind == "bc" and "\n" in val):
            if need_semi():
                toks.append(Tok("op", ";"))
        elif kind in ("ws", "lc", "bc"):
            pass
        elif kind == "raw":
            toks.append(Tok("str", val[1:-1]))
        elif kind == "str":
            toks.append(Tok("str", go_unquote(val)))
        else:
            toks.append(Tok(kind, val))
    if need_semi():
        toks.append(Tok("op", ";"))
    return toks


def go_unquote(s):
    body = s[1:-1]
    out = []
    i = 0
    esc = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "a": "\a", "b": "\b",
           "f": "\f", "v": "\v"}
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            d = body[i + 1]
            if d in esc:
                out.append(esc[d])
                i += 2
                continue
            if d == "x":
                out.append(chr(int(body[i + 2:i + 4], 16)))
                i += 4
                continue
            if d == "u":
                out.append(chr(int(body[i + 2:i + 6], 16)))
                i += 6
                continue
            if d == "U":
                out.append(chr(int(body[i + 2:i + 10], 16)))
                i += 10
                continue
            if d in "01234567":
                out.append(chr(int(body[i + 1:i + 4], 8)))
                i += 4
                continue
        out.append(c)
        i += 1
    return "".join(out)


class GoField:
    def __init__(self, name, expr, tag, embedded):
        self.name, self.expr, self.tag, self.embedded = name, expr, tag, embedded


class TypeDecl:
    def __init__(self, pkg, name, expr, alias, imports, fname):
        self.pkg, self.name, self.expr, self.alias, self.imports, self.fname = pkg, name, expr, alias, imports, fname


class Parser:
    def __init__(self, toks, fname):
        self.t = toks
        self.i = 0
        self.fname = fname

    def peek(self, k=0):
        j = self.i + k
        return self.t[j] if j < len(self.t) else Tok("eof", "")

    def is_(self, val, k=0):
        t = self.peek(k)
        return t.kind in ("op", "ident") and t.val == val

    def next(self):
        t = self.peek()
        self.i += 1
        return t

    def expect(self, val):
        t = self.next()
        if t.val != val:
            raise SyntaxError("%s: expected %r, got %r (token %d)" % (self.fname, val, t.val, self.i))
        return t

    def skip_group(self):
        """At an opening bracket: skip to just past its matching close."""
        pairs = {"(": ")", "[": "]", "{": "}"}
        open_ = self.next().val
        stack = [pairs[open_]]
        while stack:
            t = self.next()
            if t.kind == "eof":
                raise SyntaxError("%s: unbalanced %s" % (self.fname, open_))
            if t.kind == "op":
                if t.val in pairs:
                    stack.append(pairs[t.val])
                elif t.val in (")", "]", "}"):
                    if t.val != stack.pop():
                        raise SyntaxError("%s: mismatched %s" % (self.fname, t.val))

    def type_expr(self):
        t = self.peek()
        if t.kind == "op":
            if t.val == "*":
                self.next()
                return ("ptr", self.type_expr())
            if t.val == "(":
                self.next()
                e = self.type_expr()
                self.expect(")")
                return e
            if t.val == "[":
                if self.is_("]", 1):
                    self.next()
                    self.next()
                    return ("slice", self.type_expr())
                self.skip_group()
                return ("array", self.type_expr())
            if t.val == "<-":
                self.next()
                self.expect("chan")
                return ("chan", self.type_expr())
            if t.val == "~":
                self.next()
                return self.type_expr()
        if t.kind == "ident":
            if t.val == "map":
                self.next()
                self.expect("[")
                k = self.type_expr()
                self.expect("]")
                return ("map", k, self.type_expr())
            if t.val == "chan":
                self.next()
                if self.is_("<-"):
                    self.next()
                return ("chan", self.type_expr())
            if t.val == "struct":
                self.next()
                return ("struct", self.struct_fields())
            if t.val == "interface":
                self.next()
                self.skip_group()
                return ("interface",)
            if t.val == "func":
                self.next()
                self.skip_group()
                nt = self.peek()
                if nt.kind == "op" and nt.val == "(":
                    self.skip_group()
                elif (nt.kind == "ident" and nt.val not in KEYWORDS) or (nt.kind == "op" and nt.val in ("*", "[")) \
                        or (nt.kind == "ident" and nt.val in ("map", "chan", "func", "struct", "interface")):
                    self.type_expr()
                return ("func",)
            if t.val not in KEYWORDS:
                self.next()
                qual, name = None, t.val
                if self.is_("."):
                    self.next()
                    qual, name = name, self.next().val
                if self.is_("["):
                    self.skip_group()  # type arguments
                return ("named", qual, name)
        raise SyntaxError("%s: unexpected %r in type (token %d)" % (self.fname, t.val, self.i))

    def struct_fields(self):
        self.expect("{")
        fields = []
        while True:
            t = self.peek()
            if t.kind == "op" and t.val == ";":
                self.next()
                continue
            if t.kind == "op" and t.val == "}":
                self.next()
                return fields
            embedded = False
            names = []
            if t.kind == "op" and t.val == "*":
                embedded = True
            elif t.kind == "ident":
                n1 = self.peek(1)
                if n1.kind == "op" and n1.val == ".":
                    embedded = True
                elif (n1.kind == "op" and n1.val in (";", "}")) or n1.kind == "str":
                    embedded = True
                else:
                    names.append(self.next().val)
                    while self.is_(","):
                        self.next()
                        names.append(self.next().val)
            else:
                raise SyntaxError("%s: unexpected %r in struct (token %d)" % (self.fname, t.val, self.i))
            expr = self.type_expr()
            tag = ""
            if self.peek().kind == "str":
                tag = self.next().val
            if embedded:
                e = expr[1] if expr[0] == "ptr" else expr
                if e[0] != "named":
                    raise SyntaxError("%s: odd embedded field" % self.fname)
                fields.append(GoField(e[2], expr, tag, True))
            else:
                for nm in names:
                    fields.append(GoField(nm, expr, tag, False))

    def import_spec(self, imports):
        t = self.next()
        alias = None
        if t.kind in ("ident",) or (t.kind == "op" and t.val == "."):
            alias = t.val
            t = self.next()
        if t.kind != "str":
            raise SyntaxError("%s: bad import" % self.fname)
        path = t.val
        if alias is None:
            alias = path.rsplit("/", 1)[-1]
            # gopkg.in/yaml.v2 style
            alias = re.sub(r"\.v\d+$", "", alias).replace("-", "_")
        if alias not in ("_", "."):
            imports[alias] = path

    def type_spec(self, pkg, imports, decls):
        name = self.next().val
        if self.is_("["):
            k1, k2 = self.peek(1), self.peek(2)
            if k1.kind == "ident" and not (k2.kind == "op" and k2.val == "]"):
                self.skip_group()  # type parameters
        alias = False
        if self.is_("="):
            self.next()
            alias = True
        expr = self.type_expr()
        decls.append(TypeDecl(pkg, name, expr, alias, imports, self.fname))

    def file(self, pkg):
        """Top-level declarations: imports, types, method receivers."""
        imports = {}
        decls = []
        methods = []  # (receiver type name, method name)
        depth = 0
        while self.i < len(self.t):
            t = self.peek()
            if t.kind == "op" and t.val in ("(", "[", "{"):
                depth += 1
                self.next()
                continue
            if t.kind == "op" and t.val in (")", "]", "}"):
                depth -= 1
                self.next()
                continue
            if depth == 0 and t.kind == "ident" and t.val == "import":
                self.next()
                if self.is_("("):
                    self.next()
                    while not self.is_(")"):
                        if self.is_(";"):
                            self.next()
                            continue
                        self.import_spec(imports)
                    self.next()
                else:
                    self.import_spec(imports)
                continue
            if depth == 0 and t.kind == "ident" and t.val == "type":
                self.next()
                if self.is_("("):
                    self.next()
                    while not self.is_(")"):
                        if self.is_(";"):
                            self.next()
                            continue
                        self.type_spec(pkg, imports, decls)
                    self.next()
                else:
                    self.type_spec(pkg, imports, decls)
                continue
            if depth == 0 and t.kind == "ident" and t.val == "func" and self.is_("(", 1):
                # method: func (r *T) Name(
                j = self.i + 2
                toks = []
                while self.t[j].val != ")":
                    toks.append(self.t[j].val)
                    j += 1
                recv = [x for x in toks if x not in ("*",)]
                rtype = recv[-1] if recv else None
                if j + 1 < len(self.t) and self.t[j + 1].kind == "ident" and rtype:
                    methods.append((rtype, self.t[j + 1].val))
                self.next()
                continue
            self.next()
        return imports, decls, methods


def build_ok(src, fname):
    """Is the file part of a default linux/amd64 build?"""
    base = os.path.basename(fname)
    if base.endswith("_test.go"):
        return False
    parts = base[:-3].split("_")
    goos = {"aix", "android", "darwin", "dragonfly", "freebsd", "illumos", "ios", "js", "netbsd",
            "openbsd", "plan9", "solaris", "wasip1", "windows", "zos"}
    goarch = {"386", "arm", "arm64", "loong64", "mips", "mipsle", "mips64", "mips64le", "ppc64",
              "ppc64le", "riscv64", "s390x", "wasm"}
    if len(parts) > 1 and (parts[-1] in goos or parts[-1] in goarch or parts[-2] in goos):
        return False
    for line in src.split("\n"):
        s = line.strip()
        if s.startswith("package "):
            break
        m = re.match(r"//go:build\s+(.*)", s)
        if m:
            return eval_constraint(m.group(1))
    return True


def eval_constraint(expr):
    tags = {"linux", "amd64", "unix", "gc", "cgo"} | {"go1.%d" % i for i in range(1, 40)}
    toks = re.findall(r"[\w.]+|&&|\|\||!|\(|\)", expr)
    pos = [0]

    def peek():
        return toks[pos[0]] if pos[0] < len(toks) else None

    def take():
        pos[0] += 1
        return toks[pos[0] - 1]

    def or_():
        v = and_()
        while peek() == "||":
            take()
            v = and_() or v
        return v

    def and_():
        v = not_()
        while peek() == "&&":
            take()
            v = not_() and v
        return v

    def not_():
        if peek() == "!":
            take()
            return not not_()
        if peek() == "(":
            take()
            v = or_()
            take()
            return v
        return take() in tags

    return or_()


def parse_tag(tag):
    """reflect.StructTag semantics: key:"value" pairs."""
    out = {}
    i = 0
    while i < len(tag):
        while i < len(tag) and tag[i] == " ":
            i += 1
        j = i
        while j < len(tag) and tag[j] > " " and tag[j] not in ':"\x7f':
            j += 1
        if j == i or j + 1 >= len(tag) or tag[j] != ":" or tag[j + 1] != '"':
            break
        key = tag[i:j]
        k = j + 2
        while k < len(tag) and tag[k] != '"':
            if tag[k] == "\\":
                k += 1
            k += 1
        if k >= len(tag):
            break
        out[key] = go_unquote(tag[j + 1:k + 1])
        i = k + 1
    return out


class GoPkg:
    def __init__(self, path, repo, d):
        self.path, self.repo, self.dir = path, repo, d
        self.types = {}
        self.methods = defaultdict(set)          # type -> {method}, hand-written files only
        self.marshal_off = set()                 # +protobuf.options.marshal=false
        self.group = None
        self.files = {}
        for f in repo.ls(d):
            if not f.endswith(".go"):
                continue
            src = repo.read(f)
            if not build_ok(src, f):
                continue
            self.files[f] = src
            p = Parser(tokenize(src, f), f)
            try:
                imports, decls, methods = p.file(path)
            except SyntaxError as e:
                raise SystemExit("protoschema: Go parse error: %s" % e)
            for dcl in decls:
                if dcl.name in self.types:
                    raise SystemExit("protoschema: %s: type %s declared twice (%s, %s)"
                                     % (path, dcl.name, self.types[dcl.name].fname, f))
                self.types[dcl.name] = dcl
            if not os.path.basename(f).startswith(("generated.pb", "zz_generated")):
                for rt, mn in methods:
                    self.methods[rt].add(mn)
            for m in re.finditer(r"\+protobuf\.options\.marshal=false[^\n]*\n((?:[ \t]*//[^\n]*\n)*)[ \t]*(?:type\s+)?(\w+)",
                                 src):
                self.marshal_off.add(m.group(2))
            m = re.search(r"^//\s*\+groupName=(\S*)\s*$", src, re.M)
            if m and (self.group is None or os.path.basename(f) == "doc.go"):
                self.group = m.group(1)
        if self.group is None:
            for f, src in self.files.items():
                m = re.search(r'^const\s+GroupName\s*=\s*"([^"]*)"', src, re.M)
                if m:
                    self.group = m.group(1)


class World:
    def __init__(self, repos):
        self.repos = repos  # module -> Repo
        self.pkgs = {}
        self.proto_of_go = {}   # go package path -> proto package

    def pkg(self, path):
        if path not in self.pkgs:
            for mod, repo in self.repos.items():
                if path == mod or path.startswith(mod + "/"):
                    d = path[len(mod) + 1:]
                    self.pkgs[path] = GoPkg(path, repo, d)
                    break
            else:
                raise KeyError(path)
        return self.pkgs[path]

    # -- type classification --------------------------------------------
    # Kinds: ('basic', k) ('bytes',) ('struct', pkg, name) ('namedslice', pkg, name, elem)
    #        ('slice', elem) ('map', k, v) ('ptr', inner) ('interface',) ('other', desc)

    def classify(self, expr, pkg, imports, seen=()):
        k = expr[0]
        if k == "ptr":
            return ("ptr", self.classify(expr[1], pkg, imports, seen))
        if k == "slice":
            el = self.classify(expr[1], pkg, imports, seen)
            if el == ("basic", "uint8"):
                return ("bytes",)
            return ("slice", el)
        if k == "map":
            return ("map", self.classify(expr[1], pkg, imports, seen), self.classify(expr[2], pkg, imports, seen))
        if k == "struct":
            return ("other", "anonymous struct")
        if k == "interface":
            return ("interface",)
        if k == "named":
            _, qual, name = expr
            if qual is None:
                p = self.pkgs.get(pkg)
                if p is None or name not in p.types:
                    if name in GO_BASIC:
                        return ("basic", {"byte": "uint8", "rune": "int32"}.get(name, name))
                    if name in ("any", "error"):
                        return ("interface",)
                    return ("other", "%s.%s (undeclared)" % (pkg, name))
                path = pkg
            else:
                path = imports.get(qual)
                if path is None:
                    return ("other", "%s.%s (unknown import)" % (qual, name))
            if path == "time":
                if name == "Duration":
                    return ("basic", "int64")
                return ("other", "time.%s" % name)
            try:
                p = self.pkg(path)
            except KeyError:
                return ("other", "%s.%s (package not available)" % (path, name))
            d = p.types.get(name)
            if d is None:
                return ("other", "%s.%s (undeclared)" % (path, name))
            if (path, name) in seen:
                return ("other", "%s.%s (cycle)" % (path, name))
            seen = seen + ((path, name),)
            u = d.expr
            if d.alias:
                return self.classify(u, path, d.imports, seen)
            if u[0] == "struct":
                return ("struct", path, name)
            if u[0] == "slice":
                el = self.classify(u[1], path, d.imports, seen)
                if el == ("basic", "uint8"):
                    return ("bytes",)
                return ("namedslice", path, name, el)
            if u[0] == "named":
                inner = self.classify(u, path, d.imports, seen)
                if inner[0] == "struct":
                    # `type List metav1.List`: a new struct type with the same fields
                    return ("struct", path, name)
                if inner[0] == "namedslice":
                    return ("other", "%s.%s (defined from %s)" % (path, name, inner))
                return inner
            return self.classify(u, path, d.imports, seen)
        return ("other", str(expr))

    def struct_of(self, path, name):
        """(fields, package path, imports) of a named struct type, following
        `type X pkg.Y` definitions to the struct literal."""
        seen = set()
        while (path, name) not in seen:
            seen.add((path, name))
            d = self.pkg(path).types.get(name)
            if d is None:
                return None
            if d.expr[0] == "struct":
                return d.expr[1], path, d.imports
            if d.expr[0] != "named":
                return None
            qual = d.expr[1]
            if qual is not None:
                path = d.imports.get(qual)
                if path is None:
                    return None
            name = d.expr[2]
        return None

    def msg_name(self, kind):
        """Full proto message name of a struct / named slice kind, or None."""
        if kind[0] in ("struct", "namedslice"):
            pp = self.proto_of_go.get(kind[1])
            if pp:
                return pp + "." + kind[2]
        return None


def kind_str(k):
    if k[0] == "basic":
        return k[1]
    if k[0] == "bytes":
        return "[]byte"
    if k[0] in ("struct", "namedslice"):
        return "%s.%s" % (k[1], k[2])
    if k[0] == "slice":
        return "[]" + kind_str(k[1])
    if k[0] == "ptr":
        return "*" + kind_str(k[1])
    if k[0] == "map":
        return "map[%s]%s" % (kind_str(k[1]), kind_str(k[2]))
    return "%s" % (k,)


# ------------------------------------------------- generated.pb.go analysis

KEY_RE = re.compile(r"^\s*dAtA\[i\] = 0x([0-9a-f]+)\s*$")
FUNC_RE = re.compile(r"^func \(m \*?(\w+)\) MarshalToSizedBuffer\(dAtA \[\]byte\) \(int, error\) \{$")


def analyse_pb(src):
    """For each type with a generated MarshalToSizedBuffer: {GoField: (guards, keynumber)}."""
    out = {}
    lines = src.split("\n")
    i = 0
    while i < len(lines):
        m = FUNC_RE.match(lines[i])
        if not m:
            i += 1
            continue
        tname = m.group(1)
        i += 1
        body = []
        while lines[i] != "}":
            body.append(lines[i])
            i += 1
        out[tname] = analyse_body(body)
        out[tname]["\0body"] = body
    return out


def analyse_body(body):
    stack = []        # per open block: (guardkind, field) or None
    fields = {}       # field -> {"guards": set, "keys": [runs]}
    order = []
    cur = None        # field whose segment we are in
    run = []          # current run of key bytes (code order)
    last_run = {}     # field -> last key run seen in its segment
    for line in body:
        s = line.strip()
        km = KEY_RE.match(line)
        if km:
            run.append(int(km.group(1), 16))
            continue
        if s == "i--":
            continue
        if run:
            if cur is not None:
                last_run[cur] = run
            run = []
        guard = None
        gm = re.fullmatch(r"if m\.(\w+) != nil \{", s)
        if gm:
            guard = ("nil", gm.group(1))
        gm = re.fullmatch(r"if len\(m\.(\w+)\) > 0 \{", s)
        if gm:
            guard = ("len", gm.group(1))
        refs = [] if guard else re.findall(r"\bm\.(\w+)", s)
        if guard:
            refs = [guard[1]]
        for f in refs:
            if f not in fields:
                fields[f] = set()
                order.append(f)
            if f != cur:
                cur = f
            if guard and f == guard[1]:
                continue
            g = "none"
            for fr in reversed(stack):
                if fr and fr[1] == f:
                    g = fr[0]
                    break
            fields[f].add(g)
        # block structure
        closes = s.startswith("}")
        opens = s.endswith("{")
        if closes:
            stack.pop()
        if opens:
            stack.append(guard)
    if run and cur is not None:
        last_run[cur] = run
    res = {}
    for f in order:
        num = None
        r = last_run.get(f)
        if r:
            # code writes the varint backwards: reverse to get memory order
            v = 0
            for shift, b in enumerate(reversed(r)):
                v |= (b & 0x7f) << (7 * shift)
            num = v >> 3
        res[f] = (fields[f], num)
    return res


# ------------------------------------------------------------------- main

def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for key, mod, d in REPOS:
        ap.add_argument("--" + key, default=d, metavar="GITDIR", help="bare git mirror of %s (default %s)" % (mod, d))
    ap.add_argument("--tag", default=DEFAULT_TAG, help="tag to read (default %s)" % DEFAULT_TAG)
    ap.add_argument("--out", default=os.path.join(here, "..", "src", "proto", "schema.txt"),
                    help="output file (default src/proto/schema.txt next to tools/)")
    ap.add_argument("positional", nargs="*", metavar="API APIMACHINERY APIEXTENSIONS AGGREGATOR [TAG]",
                    help="the four mirror dirs and the tag may also be given positionally, in this order")
    args = ap.parse_args()
    if args.positional:
        if len(args.positional) not in (4, 5):
            ap.error("give the four mirror dirs (and optionally the tag), or none")
        for (key, _, _), v in zip(REPOS, args.positional):
            setattr(args, key, v)
        if len(args.positional) == 5:
            args.tag = args.positional[4]

    repos = {}
    readers = {}  # (module, tag) -> TagReader of an older tag
    for key, mod, _ in REPOS:
        repos[mod] = Repo(key, mod, getattr(args, key), args.tag)
    world = World(repos)

    # ---- the packages whose generated.proto make up the table
    proto_pkgs = []  # (go pkg path, ProtoFile)
    proto_src = {}   # go pkg path -> (module, path of its generated.proto)
    for mod, repo in sorted(repos.items()):
        for f in sorted(repo.tree()):
            if not f.endswith("/generated.proto"):
                continue
            d = f[: -len("/generated.proto")]
            if mod == "k8s.io/apimachinery" and d not in APIMACHINERY_PKGS:
                notes.append("left out %s/%s (not an API served by an apiserver)" % (mod, f))
                continue
            if mod == "k8s.io/apiextensions-apiserver" and not d.startswith("pkg/apis/"):
                continue
            if mod == "k8s.io/kube-aggregator" and not d.startswith("pkg/apis/"):
                continue
            pf = ProtoFile("%s/%s" % (mod, f), repo.read(f))
            gopath = mod + "/" + d
            if pf.go_package and pf.go_package != gopath:
                fail("%s: go_package %s != %s" % (pf.path, pf.go_package, gopath))
            proto_pkgs.append((gopath, pf))
            proto_src[gopath] = (mod, f)
            world.proto_of_go[gopath] = pf.package
    all_msgs = {}  # full name -> (gopath, ProtoFile, name)
    for gopath, pf in proto_pkgs:
        for name in pf.messages:
            all_msgs[pf.package + "." + name] = (gopath, pf, name)

    # ---- g lines
    glines = []
    for gopath, pf in proto_pkgs:
        p = world.pkg(gopath)
        if p.group is None:
            continue
        version = gopath.rsplit("/", 1)[1]
        if not re.fullmatch(r"v\d+((alpha|beta)\d+)?", version):
            fail("%s: group %s but odd version %s" % (gopath, p.group, version))
        glines.append((p.group or "core", version, pf.package))
    glines = sorted(set(glines), key=lambda g: "g %s %s %s" % g)

    # ---- special messages
    special = {}  # full name -> reason
    for full, (gopath, pf, name) in all_msgs.items():
        p = world.pkg(gopath)
        why = []
        ms = p.methods.get(name, set())
        hand = sorted(ms & {"Marshal", "MarshalTo", "MarshalToSizedBuffer"})
        if hand:
            why.append("hand-written " + "/".join(hand))
        if name in p.marshal_off:
            why.append("+protobuf.options.marshal=false")
        js = sorted(ms & {"MarshalJSON", "UnmarshalJSON"})
        if js:
            why.append("custom " + "/".join(js))
        if why:
            special[full] = ", ".join(why)
    # structs that embed a special type without a JSON name inherit its JSON methods
    changed = True
    while changed:
        changed = False
        for full, (gopath, pf, name) in all_msgs.items():
            d = world.pkg(gopath).types.get(name)
            if d is None or d.expr[0] != "struct":
                continue
            for gf in d.expr[1]:
                if not gf.embedded:
                    continue
                jname = parse_tag(gf.tag).get("json", "").split(",")[0]
                if jname:
                    continue
                k = world.classify(gf.expr, gopath, d.imports)
                if k[0] == "ptr":
                    k = k[1]
                mn = world.msg_name(k)
                why = "embeds %s (its methods are promoted)" % (mn or "").rsplit(".", 1)[-1]
                if mn in special and mn != full and why not in special.get(full, ""):
                    special[full] = (special[full] + ", " if full in special else "") + why
                    changed = True
    for req in REQUIRED_SPECIAL:
        if req not in all_msgs:
            fail("required special message %s is not in any generated.proto" % req)
        elif req not in special:
            fail("%s should be special but nothing marks it" % req)

    # ---- messages
    out_msgs = {}        # full -> (flags, [(num, json, type, card, inline, omitempty)])
    go_fields_of = {}    # full -> {GoFieldName: (card, number)}
    skipped_dash = []
    no_json_tag = []
    unclassified = []
    inline_ptr = []
    from_proto = []

    def ptype(pf, pfield):
        if pfield.label == "map":
            return "map<%s,%s>" % (pf.resolve(pfield.key), pf.resolve(pfield.val))
        return pf.resolve(pfield.type)

    def check_type(full, what, prototype, kind):
        """proto type (resolved) vs Go kind (element kind)."""
        if prototype == "bytes":
            ok = kind == ("bytes",)
        elif prototype in PROTO_GO:
            ok = kind[0] == "basic" and kind[1] in PROTO_GO[prototype]
        elif prototype in PROTO_SCALARS:
            ok = False
        else:
            ok = world.msg_name(kind) == prototype and prototype in all_msgs
        if not ok:
            fail("%s %s: proto type %s does not agree with Go type %s" % (full, what, prototype, kind_str(kind)))
        return ok

    for full in sorted(all_msgs):
        gopath, pf, name = all_msgs[full]
        pfields = {f.number: f for f in pf.messages[name]}
        if len(pfields) != len(pf.messages[name]):
            fail("%s: duplicate field numbers in generated.proto" % full)
        p = world.pkg(gopath)
        d = p.types.get(name)
        flags = []
        lines = []
        if d is None:
            fail("%s: no Go type %s in %s" % (full, name, gopath))
            continue
        if full in special:
            flags.append("special")
        u = d.expr
        if d.alias:
            fail("%s: Go type is an alias" % full)
            continue
        if u[0] == "slice":
            # named slice with its own message: JSON array, protobuf message with repeated field 1
            flags.insert(0, "array")
            el = world.classify(u[1], gopath, d.imports)
            pf1 = pfields.get(1)
            if len(pfields) != 1 or pf1 is None or pf1.label != "repeated" or pf1.name != "items":
                fail("%s: named slice type but generated.proto does not have just 'repeated items = 1'" % full)
                continue
            t = ptype(pf, pf1)
            check_type(full, "items", t, el)
            lines.append((1, "items", t, "rep", False, False))
            out_msgs[full] = (flags, lines)
            continue
        st = world.struct_of(gopath, name)
        if st is None:
            fail("%s: Go type %s is neither a struct nor a slice: %s" % (full, name, u))
            continue
        sfields, spath, simports = st
        if spath != gopath or u[0] != "struct":
            notes.append("%s: Go type is defined from the struct %s.%s" % (full, spath, u[2]))
        gomap = {}
        seen_nums = set()
        for gf in sfields:
            tags = parse_tag(gf.tag)
            pb = tags.get("protobuf")
            js = tags.get("json")
            jname, jopts = None, []
            if js is not None:
                parts = js.split(",")
                jname, jopts = parts[0], parts[1:]
            if pb is None or pb == "-":
                if pb is None and js is not None and "inline" in jopts:
                    pass  # metav1.TypeMeta & co.: JSON only
                continue
            pbp = pb.split(",")
            try:
                num = int(pbp[1])
            except (IndexError, ValueError):
                fail("%s.%s: bad protobuf tag %r" % (full, gf.name, pb))
                continue
            pbname = None
            for x in pbp[2:]:  # `bytes,2,name=x` (no opt/rep/req) occurs too
                if x.startswith("name="):
                    pbname = x[5:]
            kind = world.classify(gf.expr, spath, simports)
            base = kind[1] if kind[0] == "ptr" else kind
            inline = js is not None and "inline" in jopts and jname == ""
            if gf.embedded and not jname and base[0] == "struct":
                inline = True  # encoding/json inlines an untagged embedded struct
            if full in special:
                # custom JSON form: the name column holds the protobuf field name
                jsonname = pfields[num].name if num in pfields else pbname
            elif js == "-":
                # in protobuf but never in JSON: nothing to transcode
                skipped_dash.append("%s.%s (field %d %s)" % (full, gf.name, num, pbname))
                gomap[gf.name] = ("skip", num)
                seen_nums.add(num)
                continue
            elif jname:
                jsonname = jname
            elif inline:
                # no JSON member: the protobuf name stands in (e.g. volumeSource)
                jsonname = pbname or (pfields[num].name if num in pfields else gf.name)
            else:
                jsonname = gf.name  # encoding/json default: the Go field name
                if full not in special:
                    no_json_tag.append("%s.%s" % (full, gf.name))
            # cardinality
            if kind[0] == "ptr":
                if kind[1][0] in ("basic", "struct"):
                    card, el = "opt", kind[1]
                else:
                    card, el = None, kind
            elif kind[0] in ("basic", "struct"):
                card, el = "one", kind
            elif kind[0] == "bytes":
                card, el = "opt", kind
            elif kind[0] == "namedslice":
                if world.msg_name(kind) in all_msgs:
                    card, el = "opt", kind
                else:
                    card, el = "rep", kind[3]
            elif kind[0] == "slice":
                card, el = "rep", kind[1]
                if el[0] == "ptr":
                    card, el = None, kind
            elif kind[0] == "map":
                card, el = "map", kind
            else:
                card, el = None, kind
            if card is None:
                unclassified.append("%s.%s: %s" % (full, gf.name, kind_str(kind)))
                fail("%s.%s: cannot classify Go type %s" % (full, gf.name, kind_str(kind)))
                continue
            if inline and card != "one":
                inline_ptr.append("%s.%s (%s)" % (full, gf.name, card))
            pfield = pfields.get(num)
            if pfield is None:
                fail("%s.%s: Go field number %d is not in generated.proto" % (full, gf.name, num))
                continue
            if num in seen_nums:
                fail("%s: field number %d twice in Go" % (full, num))
            seen_nums.add(num)
            if pbname and pbname != pfield.name:
                fail("%s.%s: protobuf name %s != generated.proto name %s" % (full, gf.name, pbname, pfield.name))
            t = ptype(pf, pfield)
            want_label = {"one": "optional", "opt": "optional", "rep": "repeated", "map": "map"}[card]
            if pfield.label != want_label:
                fail("%s.%s: generated.proto label %s but Go type %s is %s"
                     % (full, gf.name, pfield.label, kind_str(kind), card))
            if card == "map":
                kk, vv = el[1], el[2]
                check_type(full, gf.name + " key", pf.resolve(pfield.key), kk)
                check_type(full, gf.name + " value", pf.resolve(pfield.val), vv)
            else:
                check_type(full, gf.name, t, el)
            omitempty = kind[0] == "bytes" and "omitempty" in jopts and full not in special
            lines.append((num, jsonname, t, card, inline, omitempty))
            gomap[gf.name] = (card, num)
        for num, pfield in sorted(pfields.items()):
            if num in seen_nums:
                continue
            if full in special:
                # hand-written Marshal over a Go struct without this field (Time, MicroTime, Quantity…)
                t = ptype(pf, pfield)
                card = {"optional": "opt" if t not in OUT_SCALARS else "one", "repeated": "rep", "map": "map"}[pfield.label]
                lines.append((num, pfield.name, t, card, False, False))
                from_proto.append("%s field %d %s (%s)" % (full, num, pfield.name, card))
            else:
                fail("%s: generated.proto field %d %s has no Go field" % (full, num, pfield.name))
        lines.sort()
        out_msgs[full] = (flags, lines)
        go_fields_of[full] = gomap

    # every proto message appears
    for full in all_msgs:
        if full not in out_msgs:
            fail("%s: missing from the table" % full)

    # ---- since=<minor>: first minor whose generated.proto has the field
    since_tags = {}  # module -> [(minor, tag)]
    for _, mod, _ in REPOS:
        lst = []
        for minor in SINCE_MINORS:
            t = since_tag(repos[mod], minor)
            if t is None:
                fail("%s: no v0.%d.x tag in %s (needed for since=)" % (mod, minor, repos[mod].gitdir))
                continue
            lst.append((minor, t))
        since_tags[mod] = lst
    old_fields = {}  # (module, proto path) -> [(minor, {message: {numbers}} or None)]
    for gopath in sorted(proto_src):
        mod, f = proto_src[gopath]
        per = []
        for minor, t in since_tags[mod]:
            if t == repos[mod].tag:
                rd = repos[mod]
            else:
                if (mod, t) not in readers:
                    readers[(mod, t)] = TagReader(repos[mod], t)
                rd = readers[(mod, t)]
            if f not in rd.tree():
                per.append((minor, None))
                continue
            opf = ProtoFile("%s@%s/%s" % (mod, t, f), rd.read(f))
            per.append((minor, {n: {x.number for x in fl} for n, fl in opf.messages.items()}))
        old_fields[(mod, f)] = per
    since = {}  # (full, num) -> minor, only for fields missing from the baseline
    since_count = defaultdict(int)
    for full in sorted(out_msgs):
        gopath, pf, name = all_msgs[full]
        per = old_fields[proto_src[gopath]]
        for num, jn, t, card, inline, _ in out_msgs[full][1]:
            first = None
            for minor, msgs in per:
                if msgs is not None and num in msgs.get(name, ()):
                    first = minor
                    break
            if first is None:
                fail("%s field %d %s: in no generated.proto of the since= tags" % (full, num, jn))
            elif first != SINCE_MINORS[0]:
                since[(full, num)] = first
                since_count[first] += 1

    # ---- generated.pb.go cross-check
    pb_checked = 0
    pb_fields = 0
    pb_mismatch = []
    pb_unchecked = []
    expect_guard = {"one": "none", "opt": "nil", "rep": "len", "map": "len"}
    for gopath, pf in proto_pkgs:
        p = world.pkg(gopath)
        pbpath = p.dir + "/generated.pb.go"
        if pbpath not in p.repo.tree():
            continue
        info = analyse_pb(p.repo.read(pbpath))
        for name in pf.messages:
            full = pf.package + "." + name
            if name not in info:
                pb_unchecked.append(full)
                continue
            pb_checked += 1
            body = dict(info[name])
            raw = body.pop("\0body")
            if full not in go_fields_of:
                # array message (named slice): `if len(m) > 0 { for … { …; dAtA[i] = 0xa } }`
                txt = "\n".join(x.strip() for x in raw)
                if "if len(m) > 0 {" not in txt or "dAtA[i] = 0xa" not in txt or body:
                    pb_mismatch.append("%s: Marshal is not that of a repeated field 1" % full)
                pb_fields += 1
                continue
            for gname, (card, num) in sorted(go_fields_of[full].items()):
                if gname not in body:
                    pb_mismatch.append("%s.%s: not written by MarshalToSizedBuffer" % (full, gname))
                    continue
                guards, keynum = body[gname]
                if card == "skip":
                    continue
                pb_fields += 1
                if guards != {expect_guard[card]}:
                    pb_mismatch.append("%s.%s: table says %s, Marshal guards %s"
                                       % (full, gname, card, ",".join(sorted(guards))))
                if keynum != num:
                    pb_mismatch.append("%s.%s: table says field %d, Marshal writes key of field %s"
                                       % (full, gname, num, keynum))
            for gname in body:
                if gname not in go_fields_of[full]:
                    pb_mismatch.append("%s.%s: written by MarshalToSizedBuffer but not in the table" % (full, gname))
    for mm in pb_mismatch:
        fail("generated.pb.go: " + mm)

    # ---- report
    for s in skipped_dash:
        warn("skipped (protobuf tag but json:\"-\"): " + s)
    for s in no_json_tag:
        warn("no json tag, JSON name is the Go field name: " + s)
    for s in inline_ptr:
        warn("inline field that is not 'one': " + s)
    for s in from_proto:
        warn("special message field taken from generated.proto (no Go field): " + s)
    warn("since=: %d fields not in v0.%d: %s" % (len(since), SINCE_MINORS[0], ", ".join(
        "%d at %d" % (since_count[m], m) for m in sorted(since_count))))
    for n in notes:
        warn("note: " + n)
    for full in sorted(special):
        warn("special: %s (%s)" % (full, special[full]))
    warn("generated.pb.go: %d messages, %d fields checked (guard and key); %d mismatches; no generated Marshal: %s"
         % (pb_checked, pb_fields, len(pb_mismatch), ", ".join(pb_unchecked) or "none"))
    if unclassified:
        warn("unclassified Go types: %s" % "; ".join(unclassified))
    if errors:
        for e in errors:
            print("protoschema: ERROR: " + e, file=sys.stderr)
        print("protoschema: %d errors; nothing written" % len(errors), file=sys.stderr)
        return 1

    # ---- write
    header = "# generated by tools/protoschema.py from %s — do not edit" % ", ".join(
        "%s %s" % (mod, repos[mod].tag) for _, mod, _ in REPOS)
    out = [header]
    for n in notes:
        if "no tag" in n:
            out.append("# " + n)
    out.append("# since=<minor>: first of %s whose generated.proto has the field (none: already in %s)" % (
        "; ".join("%s %s" % (mod, " ".join(t for _, t in since_tags[mod])) for _, mod, _ in REPOS),
        ", ".join(sorted({since_tags[mod][0][1] for _, mod, _ in REPOS}))))
    for g in glines:
        out.append("g %s %s %s" % g)
    for full in sorted(out_msgs):
        flags, lines = out_msgs[full]
        out.append(" ".join(["m", full] + flags))
        for num, jn, t, card, inline, omitempty in lines:
            out.append("f %d %s %s %s%s%s%s" % (num, jn, t, card, " inline" if inline else "",
                                               " omitempty" if omitempty else "",
                                               " since=%d" % since[(full, num)] if (full, num) in since else ""))
    text = "\n".join(out) + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as fh:
        fh.write(text)
    warn("wrote %s: %d bytes, %d group versions, %d messages, %d fields"
         % (args.out, len(text.encode()), len(glines), len(out_msgs), sum(len(v[1]) for v in out_msgs.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
