"""Cut a module of a published wheel down to named top-level definitions and what they use.

Used by lab/offline/sglang_carry.sh and lab/offline/vllm_carry.sh (their inline Python puts lab/offline/ on sys.path
and imports this module) to generate the "extracted" files of .sgl/site and .vllm/site: from the
source text of one wheel module (read and RECORD-checked by the script), keep only the top-level
names its keep-list line gives (lab/offline/sglang_keep.txt, lab/offline/vllm_keep.txt) and, transitively, the
top-level statements they use, as byte-identical source segments (import statements cut down to the
names kept), under a generated docstring saying so.  extract_module() returns the module text; it
reads and writes no files.  A keep-list line that does not fit the module raises ExtractError, whose
message the scripts exit with.
"""
import ast

__all__ = ['ExtractError', 'bound', 'global_refs', 'extract_module']


class ExtractError(ValueError):
    """A keep-list line that does not fit the wheel's module (the message says where and why)."""


def bound(stmt):
    """Names a top-level statement binds ('*' for a star import); for a statement that only
    mutates a module-level object (x.a = ..., x[k] = ..., x += ...), that object's name."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {a.asname or a.name.split('.')[0] for a in stmt.names}
    if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        if isinstance(stmt, ast.AnnAssign) and stmt.value is None:
            return set()                                     # a bare annotation binds nothing
        out = set()
        for t in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
            while isinstance(t, (ast.Attribute, ast.Subscript, ast.Starred)):
                t = t.value
            out |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        return out
    if isinstance(stmt, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
        out = set()                                          # bindings in any branch
        for field in ('body', 'orelse', 'finalbody'):
            for s in getattr(stmt, field, []):
                out |= bound(s)
        for h in getattr(stmt, 'handlers', []):
            out |= {h.name} if h.name else set()
            for s in h.body:
                out |= bound(s)
        if isinstance(stmt, ast.For):
            out |= {n.id for n in ast.walk(stmt.target) if isinstance(n, ast.Name)}
        if isinstance(stmt, ast.With):
            out |= {n.id for i in stmt.items if i.optional_vars for n in ast.walk(i.optional_vars)
                    if isinstance(n, ast.Name)}
        return out
    return set()                                             # expressions, asserts, ...: dropped


def global_refs(stmt, lazy_annotations):
    """Module-level names a top-level statement reads (at import or when its functions run).
    Function, lambda, comprehension and class scopes are followed; annotations are skipped under
    `from __future__ import annotations`."""
    refs = set()

    def stores(nodes):
        out, glob = set(), set()
        for node in nodes:
            for n in ast.walk(node):
                if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
                    out.add(n.id)
                elif isinstance(n, ast.arg):
                    out.add(n.arg)
                elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    out.add(n.name)
                elif isinstance(n, (ast.Import, ast.ImportFrom)):
                    out |= {a.asname or a.name.split('.')[0] for a in n.names}
                elif isinstance(n, ast.ExceptHandler) and n.name:
                    out.add(n.name)
                elif isinstance(n, (ast.Global, ast.Nonlocal)):
                    glob |= set(n.names)
        return out - glob

    def visit(node, local):                  # local: the names of the enclosing function scopes
        if node is None:
            return
        if isinstance(node, list):
            for n in node:
                visit(n, local)
            return
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load) and node.id not in local:
                refs.add(node.id)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            visit(node.args.defaults + node.args.kw_defaults, local)
            if not isinstance(node, ast.Lambda):
                visit(node.decorator_list, local)
                if not lazy_annotations:
                    a = node.args
                    visit([x.annotation for x in a.posonlyargs + a.args + a.kwonlyargs
                           + [a.vararg, a.kwarg] if x is not None] + [node.returns], local)
            body = node.body if isinstance(node.body, list) else [node.body]
            visit(body, local | stores([node.args] + body))
            return
        if isinstance(node, ast.ClassDef):
            visit(node.decorator_list + node.bases + [k.value for k in node.keywords], local)
            # the class body runs in its own scope: names it assigns shadow the module's there only
            class_local = local | {n.id for s in node.body for n in ast.walk(s)
                                   if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                                   and not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
            for s in node.body:
                visit(s, local if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) else class_local)
            return
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            inner = local | {n.id for g in node.generators for n in ast.walk(g.target)
                             if isinstance(n, ast.Name)}
            visit(node.generators[0].iter, local)
            for g in node.generators:
                visit(g.ifs + ([g.iter] if g is not node.generators[0] else []), inner)
            visit([node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt], inner)
            return
        if isinstance(node, ast.AnnAssign):
            if not lazy_annotations:
                visit(node.annotation, local)
            visit([node.target, node.value], local)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, local)

    visit(stmt, frozenset())
    return refs


def _wrap(text, width=96):
    """`text`'s words in lines of at most `width` characters (a longer word stands alone)."""
    wrapped, line = [], ''
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            wrapped.append(line)
            line = word
        else:
            line = f'{line} {word}' if line else word
    return '\n'.join(wrapped + [line])


def extract_module(src, path, *, tool, package, version, keep_list, roots, unbound=(),
                   add_future=False):
    """`src` (the text of `path` in the `package` `version` wheel) cut down to the top-level names
    `roots` (['*']: its star imports; []: none) and the top-level statements they use, under a
    docstring saying that `tool` generated it per `keep_list`.  Names in `unbound` are left out
    although the kept ones refer to them (on paths the carry does not take); `add_future` adds
    `from __future__ import annotations` so that annotations naming what is not kept stay
    unevaluated.  Returns (text, the names pulled in besides `roots`); raises ExtractError."""
    unbound = set(unbound)
    lines = src.splitlines(keepends=True)
    tree = ast.parse(src)
    future = [s for s in tree.body if isinstance(s, ast.ImportFrom) and s.module == '__future__']
    lazy = any(a.name == 'annotations' for s in future for a in s.names)
    if add_future and lazy:
        raise ExtractError(f'{keep_list}: {path} has `from __future__ import annotations` already')
    lazy = lazy or add_future
    body = [s for s in tree.body if s not in future]
    binds = [bound(s) for s in body]
    defined = set().union(*binds) if binds else set()
    for r in list(roots) + sorted(unbound):
        if r not in defined:
            raise ExtractError(f'{keep_list}: {path} binds no top-level {r!r}')
    needed, todo, kept, used_unbound = set(), list(roots), set(), set()
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        for i, (s, b) in enumerate(zip(body, binds)):
            if name in b and i not in kept:
                kept.add(i)
                if not isinstance(s, (ast.Import, ast.ImportFrom)):
                    for r in global_refs(s, lazy) & defined:
                        if r in unbound:
                            used_unbound.add(r)
                        else:
                            todo.append(r)
    if unbound - used_unbound:
        raise ExtractError(f'{keep_list}: {path}: {sorted(unbound - used_unbound)} not referred to by'
                           ' the names kept')
    if unbound & needed:
        raise ExtractError(f'{keep_list}: {path}: {sorted(unbound & needed)} both kept and left unbound')
    pieces = []
    for i in sorted(kept):
        s = body[i]
        first = min([s.lineno] + [d.lineno for d in getattr(s, 'decorator_list', [])])
        segment = ''.join(lines[first - 1:s.end_lineno])
        others = [t for t in tree.body if t is not s and t.lineno <= s.end_lineno and t.end_lineno >= first]
        if others or s.col_offset:
            raise ExtractError(f'{path}:{first}: statement shares its lines with another')
        if isinstance(s, (ast.Import, ast.ImportFrom)):
            aliases = [a for a in s.names if (a.asname or a.name.split('.')[0]) in needed]
            if len(aliases) < len(s.names):                  # cut down: generated, not a segment
                segment = ast.unparse(type(s)(names=aliases, **({'module': s.module, 'level': s.level}
                                      if isinstance(s, ast.ImportFrom) else {}))) + '\n'
        pieces.append((isinstance(s, (ast.Import, ast.ImportFrom)), segment))
    listed = ('its star imports' if list(roots) == ['*'] else 'only ' + ' '.join(roots) if roots else
              'the package itself, none of its names (its carried submodules import through it)'
              if path.endswith('/__init__.py') else
              'none of its names (an empty module: what imports it uses none of them on this path)')
    pulled = sorted(needed - set(roots) - {'*'})
    doc = (f'Generated by {tool} from {path} of the {package} {version} wheel: {listed}'
           + (f'; with the top-level names those use: {" ".join(pulled)}' if pulled else '')
           + (f'; left unbound (used only on paths the carry does not take): {" ".join(sorted(unbound))}'
              if unbound else '')
           + '. Every statement below is a byte-identical source segment of that file, except'
             ' import statements cut down to the names kept'
           + (' and the `from __future__ import annotations` line, added here so that the annotations'
              ' naming definitions not kept stay unevaluated' if add_future else '')
           + f' ({keep_list}). Do not edit: rebuilt from the wheel on each run.')
    text = '"""' + _wrap(doc) + '\n"""\n'
    text += ''.join('\n' + ast.get_source_segment(src, s) + '\n' for s in future)
    if add_future:
        text += '\nfrom __future__ import annotations\n'
    prev_import = None
    for is_import, segment in pieces:
        text += '\n' if prev_import is None else '' if is_import and prev_import else '\n\n'
        text += segment
        prev_import = is_import
    compile(text, path, 'exec')
    return text, pulled
