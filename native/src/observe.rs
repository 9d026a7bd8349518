//! The observed steps and the trajectory of a partition's canonical spans: evaluator/steps.py
//! `extract_steps_from_spans` and evaluator/trajectory_build.py `build_trajectory_from_spans` (the
//! references this must equal, tests/native/test_observe.py), in one pass over the spans' Python
//! objects. It reads the canonical model, not wire bytes, so every decoder's spans take it.
//!
//! Where a value's meaning is Python's own (JSON text, `str()` of a non-string, Unicode case
//! mapping, a GenAI messages document) it calls the evaluator's Python function for it; where a
//! span holds something the reference would treat in a way not reproduced here (non-int times,
//! non-ASCII tool-call keys, integers beyond 64 bits) it gives up (`Unhandled`) and the caller
//! runs the Python reference.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap, HashSet};

use crate::Fnv;

pub(crate) type FnvSet<K> = HashSet<K, std::hash::BuildHasherDefault<Fnv>>;
type FnvMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<Fnv>>;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyList, PyString, PyTuple};

/// Why the native pass stops: the Python reference must decide (or a Python callback raised).
pub enum Unhandled {
    Value,
    Python,
}

impl From<PyErr> for Unhandled {
    fn from(_: PyErr) -> Self {
        Unhandled::Python
    }
}

pub(crate) type Res<T> = Result<T, Unhandled>;

/// The evaluator's Python functions this pass defers to (see the module doc), and the classes it
/// builds: evaluator.model.Step (slots) and evaluator.trajectory.TrajectoryStep (a pydantic model,
/// built as evaluator.model.construct builds it).
pub struct Hooks<'py> {
    pub unwrap_json: Bound<'py, PyAny>,
    pub genai_tool_calls: Bound<'py, PyAny>,
    pub normalise_tool_name: Bound<'py, PyAny>,
    pub step: Bound<'py, PyAny>,
    pub trajectory_step: (Bound<'py, PyAny>, Bound<'py, PyAny>),
    pub json_dumps: Bound<'py, PyAny>,
    pub object_new: Bound<'py, PyAny>,
}

/// `object.__setattr__(obj, name, value)`: past a frozen class's own __setattr__, as
/// evaluator/model.py's construct and new_step set fields.
pub fn set_field(
    obj: &Bound<'_, PyAny>,
    name: &Bound<'_, PyString>,
    value: &Bound<'_, PyAny>,
) -> PyResult<()> {
    // SAFETY: three valid object pointers held by the caller; the GIL is held (Bound).
    if unsafe { pyo3::ffi::PyObject_GenericSetAttr(obj.as_ptr(), name.as_ptr(), value.as_ptr()) } == -1 {
        return Err(PyErr::fetch(obj.py()));
    }
    Ok(())
}

impl<'py> Hooks<'py> {
    /// model.py `new_step(...)`: a Step filled through its slots.
    #[allow(clippy::too_many_arguments)]
    fn new_step(
        &self,
        name: &Bound<'py, PyAny>,
        kind: &Bound<'py, PyString>,
        trace_id: &Bound<'py, PyAny>,
        span_id: &Bound<'py, PyAny>,
        start: &Bound<'py, PyAny>,
        input: &Bound<'py, PyAny>,
        output: &Bound<'py, PyAny>,
        round_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = name.py();
        let step = self.object_new.call1((&self.step,))?;
        set_field(&step, intern!(py, "name"), name)?;
        set_field(&step, intern!(py, "kind"), kind)?;
        set_field(&step, intern!(py, "trace_id"), trace_id)?;
        set_field(&step, intern!(py, "span_id"), span_id)?;
        set_field(&step, intern!(py, "start_time_unix_nano"), start)?;
        set_field(&step, intern!(py, "input"), input)?;
        set_field(&step, intern!(py, "output"), output)?;
        set_field(&step, intern!(py, "round_id"), round_id)?;
        Ok(step)
    }

    /// trajectory_build.py `new_trajectory_step(tool, input, output)`.
    fn new_trajectory_step(
        &self,
        tool: &Bound<'py, PyAny>,
        input: &Bound<'py, PyAny>,
        output: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = tool.py();
        let (cls, fields_set) = &self.trajectory_step;
        let fields = PyDict::new(py);
        fields.set_item(intern!(py, "tool"), tool)?;
        fields.set_item(intern!(py, "input"), input)?;
        fields.set_item(intern!(py, "output"), output)?;
        let step = self.object_new.call1((cls,))?;
        set_field(&step, intern!(py, "__dict__"), &fields)?;
        set_field(&step, intern!(py, "__pydantic_fields_set__"), fields_set)?;
        set_field(&step, intern!(py, "__pydantic_extra__"), &PyDict::new(py))?;
        set_field(
            &step,
            intern!(py, "__pydantic_private__"),
            &py.None().into_bound(py),
        )?;
        Ok(step)
    }
}

#[derive(Clone)]
pub(crate) struct View<'py> {
    pub(crate) attrs: Bound<'py, PyDict>,
    pub(crate) trace_py: Bound<'py, PyString>,
    pub(crate) span_py: Bound<'py, PyString>,
    pub(crate) parent_py: Option<Bound<'py, PyString>>,
    pub(crate) name_py: Bound<'py, PyString>,
    pub(crate) start_py: Bound<'py, PyAny>,
    pub(crate) start: Option<i128>,
    pub(crate) end: Option<i128>,
    pub(crate) seq: i128,
}

/// A str's UTF-8, checked once in `view` (afterwards it cannot fail: a Python str is immutable).
fn utf8<'a>(s: &'a Bound<'_, PyString>) -> &'a str {
    s.to_str().unwrap_or_default()
}

impl View<'_> {
    pub(crate) fn trace(&self) -> &str {
        utf8(&self.trace_py)
    }
    pub(crate) fn span(&self) -> &str {
        utf8(&self.span_py)
    }
    pub(crate) fn name(&self) -> &str {
        utf8(&self.name_py)
    }
    pub(crate) fn parent(&self) -> Option<&str> {
        self.parent_py.as_ref().map(utf8)
    }
}

/// A Python int (exactly `int`) as i128 through the 64-bit conversions; None: not handled here.
fn int_of(value: &Bound<'_, PyAny>) -> Option<i128> {
    if !value.is_exact_instance_of::<PyInt>() {
        return None;
    }
    if let Ok(n) = value.extract::<i64>() {
        return Some(n.into());
    }
    value.extract::<u64>().ok().map(i128::from)
}

fn text(value: &Bound<'_, PyAny>) -> Res<String> {
    let s = value.downcast::<PyString>().map_err(|_| Unhandled::Value)?;
    Ok(s.to_str().map_err(|_| Unhandled::Value)?.to_owned())
}

/// A str field whose UTF-8 the pass can read (a lone surrogate cannot be: the reference decides).
fn str_field<'py>(value: Bound<'py, PyAny>) -> Res<Bound<'py, PyString>> {
    let s = value.downcast_into::<PyString>().map_err(|_| Unhandled::Value)?;
    s.to_str().map_err(|_| Unhandled::Value)?;
    Ok(s)
}

fn optional_time(value: &Bound<'_, PyAny>) -> Res<Option<i128>> {
    if value.is_none() {
        return Ok(None);
    }
    int_of(value).map(Some).ok_or(Unhandled::Value)
}

pub(crate) fn view<'py>(span: &Bound<'py, PyAny>) -> Res<View<'py>> {
    let py = span.py();
    let fields = span
        .getattr(intern!(py, "__dict__"))?
        .downcast_into::<PyDict>()
        .map_err(|_| Unhandled::Value)?;
    let get = |key: &Bound<'py, PyString>| -> Res<Bound<'py, PyAny>> {
        fields.get_item(key)?.ok_or(Unhandled::Value)
    };
    let attrs = get(intern!(py, "attributes"))?
        .downcast_into::<PyDict>()
        .map_err(|_| Unhandled::Value)?;
    let parent = get(intern!(py, "parent_span_id"))?;
    let start_py = get(intern!(py, "start_time_unix_nano"))?;
    Ok(View {
        trace_py: str_field(get(intern!(py, "trace_id"))?)?,
        span_py: str_field(get(intern!(py, "span_id"))?)?,
        parent_py: if parent.is_none() {
            None
        } else {
            Some(str_field(parent)?)
        },
        name_py: str_field(get(intern!(py, "name"))?)?,
        start: optional_time(&start_py)?,
        end: optional_time(&get(intern!(py, "end_time_unix_nano"))?)?,
        seq: int_of(&get(intern!(py, "seq"))?).ok_or(Unhandled::Value)?,
        attrs,
        start_py,
    })
}

/// steps.py `_order`: (0, start, name, seq) for a timed span, (1, seq, name, 0) for an untimed one.
fn step_order(a: &View<'_>, b: &View<'_>) -> Ordering {
    let key = |v: &View<'_>| match v.start {
        Some(start) => (0u8, start, v.seq),
        None => (1u8, v.seq, 0),
    };
    let (af, ax, ay) = key(a);
    let (bf, bx, by) = key(b);
    (af, ax)
        .cmp(&(bf, bx))
        .then_with(|| a.name().cmp(b.name()))
        .then(ay.cmp(&by))
}

/// partitioning.py `span_order_key`: (0, start, seq) timed, (1, 0, seq) untimed.
pub(crate) fn span_order(a: &View<'_>, b: &View<'_>) -> Ordering {
    let key = |v: &View<'_>| match v.start {
        Some(start) => (0u8, start, v.seq),
        None => (1u8, 0, v.seq),
    };
    key(a).cmp(&key(b))
}

/// `attributes.get(key)` with None read as absent (what every `.get(...) is not None` test does).
pub(crate) fn get<'py>(
    attrs: &Bound<'py, PyDict>,
    key: &Bound<'py, PyString>,
) -> Res<Option<Bound<'py, PyAny>>> {
    Ok(attrs.get_item(key)?.filter(|v| !v.is_none()))
}

pub(crate) fn is_empty_str(value: &Bound<'_, PyAny>) -> bool {
    value
        .downcast::<PyString>()
        .is_ok_and(|s| s.to_str().is_ok_and(str::is_empty))
}

/// `str(value).upper() == word` (word upper-case ASCII); non-ASCII text through Python's upper().
fn upper_is(value: &Bound<'_, PyAny>, word: &str) -> Res<bool> {
    let s = value.str()?;
    if let Ok(t) = s.to_str() {
        if t.is_ascii() {
            return Ok(t.eq_ignore_ascii_case(word));
        }
    }
    Ok(s.call_method0(intern!(value.py(), "upper"))?.eq(word)?)
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Tool,
    Agent,
}

/// steps.py `step_kind`.
fn step_kind(attrs: &Bound<'_, PyDict>) -> Res<Option<Kind>> {
    let py = attrs.py();
    if let Some(kind) = get(attrs, intern!(py, "openinference.span.kind"))? {
        return Ok(if upper_is(&kind, "TOOL")? {
            Some(Kind::Tool)
        } else if upper_is(&kind, "AGENT")? {
            Some(Kind::Agent)
        } else {
            None
        });
    }
    if let Some(operation) = get(attrs, intern!(py, "gen_ai.operation.name"))? {
        if let Ok(s) = operation.downcast::<PyString>() {
            match s.to_str() {
                Ok("execute_tool") => return Ok(Some(Kind::Tool)),
                Ok("invoke_agent") => return Ok(Some(Kind::Agent)),
                _ => {}
            }
        }
    }
    Ok(attrs
        .contains(intern!(py, "gen_ai.tool.name"))?
        .then_some(Kind::Tool))
}

/// The first of `keys` that is present, not None and not "", as `str()`; None when none is.
fn named_by<'py>(v: &View<'py>, keys: &[&Bound<'py, PyString>]) -> Res<Option<Bound<'py, PyString>>> {
    for key in keys {
        if let Some(value) = get(&v.attrs, key)? {
            if !is_empty_str(&value) {
                return Ok(Some(str_field(value.str()?.into_any())?));
            }
        }
    }
    Ok(None)
}

/// steps.py `EXECUTE_TOOL_PREFIX`: the OTel GenAI span-name convention `execute_tool {tool}`.
const EXECUTE_TOOL_PREFIX: &str = "execute_tool ";

/// steps.py `tool_step_name`: the name attributes, else the span name without the GenAI
/// `execute_tool ` prefix (`bare_tool_name`).
fn tool_step_name<'py>(v: &View<'py>) -> Res<Bound<'py, PyString>> {
    let py = v.attrs.py();
    if let Some(name) = named_by(v, &[intern!(py, "gen_ai.tool.name"), intern!(py, "tool.name")])? {
        return Ok(name);
    }
    match v.name().strip_prefix(EXECUTE_TOOL_PREFIX) {
        Some(bare) if !bare.is_empty() => Ok(PyString::new(py, bare)),
        _ => Ok(v.name_py.clone()),
    }
}

fn agent_step_name<'py>(v: &View<'py>) -> Res<Bound<'py, PyString>> {
    let py = v.attrs.py();
    let keys = [
        intern!(py, "aip.agent.name"),
        intern!(py, "gen_ai.agent.name"),
        intern!(py, "agent.name"),
    ];
    Ok(named_by(v, &keys)?.unwrap_or_else(|| v.name_py.clone()))
}

struct Call<'py> {
    name_py: Bound<'py, PyAny>,
    name: String,
    /// Unwrapped (steps.py unwraps every call's arguments, used or not).
    arguments: Bound<'py, PyAny>,
    call_id: Option<String>,
}

const OI_PREFIX: &str = "llm.output_messages.";

/// (N, M, field 0 name / 1 arguments / 2 id) of `llm.output_messages.N.message.tool_calls.M.
/// tool_call.FIELD`, as steps.py `_OI_TOOL_CALL` matches it (ASCII keys; `$` admits one final
/// newline, as Python's does); Err for keys the regex's Unicode `\d` might read otherwise.
fn oi_key(key: &str) -> Res<Option<(u64, u64, usize)>> {
    if !key.is_ascii() {
        return Err(Unhandled::Value);
    }
    let key = key.strip_suffix('\n').unwrap_or(key);
    let Some(rest) = key.strip_prefix(OI_PREFIX) else {
        return Ok(None);
    };
    let digits = |s: &str| s.bytes().take_while(u8::is_ascii_digit).count();
    let n_len = digits(rest);
    let Some(rest) = rest.get(n_len..).filter(|_| n_len > 0) else {
        return Ok(None);
    };
    let n_text = &key[OI_PREFIX.len()..OI_PREFIX.len() + n_len];
    let Some(rest) = rest.strip_prefix(".message.tool_calls.") else {
        return Ok(None);
    };
    let m_len = digits(rest);
    if m_len == 0 {
        return Ok(None);
    }
    let (m_text, rest) = rest.split_at(m_len);
    let field = match rest {
        ".tool_call.function.name" => 0,
        ".tool_call.function.arguments" => 1,
        ".tool_call.id" => 2,
        _ => return Ok(None),
    };
    let n = n_text.parse::<u64>().map_err(|_| Unhandled::Value)?;
    let m = m_text.parse::<u64>().map_err(|_| Unhandled::Value)?;
    Ok(Some((n, m, field)))
}

/// steps.py `embedded_tool_calls`.
fn embedded_calls<'py>(v: &View<'py>, hooks: &Hooks<'py>) -> Res<Vec<Call<'py>>> {
    let py = v.attrs.py();
    let mut found: BTreeMap<(u64, u64), [Option<Bound<'py, PyAny>>; 3]> = BTreeMap::new();
    for (key, value) in v.attrs.iter() {
        let key = key.downcast_into::<PyString>().map_err(|_| Unhandled::Value)?;
        let key = key.to_str().map_err(|_| Unhandled::Value)?;
        if key.starts_with(OI_PREFIX) && key.contains("tool_calls") {
            if let Some((n, m, field)) = oi_key(key)? {
                found.entry((n, m)).or_default()[field] = Some(value);
            }
        }
    }
    let mut calls = Vec::new();
    for [name, arguments, call_id] in found.into_values() {
        let Some(name) = name else { continue };
        if !name.is_truthy()? {
            continue;
        }
        let name_py = name.str()?;
        let call_id = match call_id {
            Some(id) if id.is_truthy()? => Some(id.str()?.to_str().map_err(|_| Unhandled::Value)?.to_owned()),
            _ => None,
        };
        calls.push(Call {
            name: name_py.to_str().map_err(|_| Unhandled::Value)?.to_owned(),
            name_py: name_py.into_any(),
            arguments: unwrap(arguments, hooks)?,
            call_id,
        });
    }
    if let Some(messages) = get(&v.attrs, intern!(py, "gen_ai.output.messages"))? {
        for call in hooks
            .genai_tool_calls
            .call1((messages,))?
            .downcast_into::<PyList>()
            .map_err(|_| Unhandled::Value)?
            .iter()
        {
            let call = call.downcast_into::<PyTuple>().map_err(|_| Unhandled::Value)?;
            let name_py = call.get_item(0)?;
            let call_id = call.get_item(2)?;
            calls.push(Call {
                name: text(&name_py)?,
                name_py,
                arguments: call.get_item(1)?,
                call_id: if call_id.is_none() {
                    None
                } else {
                    Some(text(&call_id)?)
                },
            });
        }
    }
    Ok(calls)
}

/// steps.py `unwrap_json`: only a non-empty string can change, and Python decides how.
fn unwrap<'py>(value: Option<Bound<'py, PyAny>>, hooks: &Hooks<'py>) -> Res<Bound<'py, PyAny>> {
    match value {
        None => Ok(hooks.unwrap_json.py().None().into_bound(hooks.unwrap_json.py())),
        Some(v) if v.downcast::<PyString>().is_ok() && !is_empty_str(&v) => {
            Ok(hooks.unwrap_json.call1((v,))?)
        }
        Some(v) => Ok(v),
    }
}

fn normalise(name: &str, hooks: &Hooks<'_>) -> Res<String> {
    if name.is_ascii() {
        return Ok(name
            .bytes()
            .filter(|b| *b != b'-' && *b != b'_')
            .map(|b| b.to_ascii_lowercase() as char)
            .collect());
    }
    let out = hooks.normalise_tool_name.call1((name,))?;
    text(&out)
}

/// A tool span's unwrapped (input, output), parsed once for the steps and the trajectory.
fn tool_io<'py>(
    v: &View<'py>,
    index: usize,
    cache: &mut FnvMap<usize, (Bound<'py, PyAny>, Bound<'py, PyAny>)>,
    hooks: &Hooks<'py>,
) -> Res<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    if let Some(found) = cache.get(&index) {
        return Ok(found.clone());
    }
    let py = v.attrs.py();
    let first = |a: &Bound<'py, PyString>, b: &Bound<'py, PyString>| -> Res<Option<Bound<'py, PyAny>>> {
        Ok(match get(&v.attrs, a)? {
            Some(value) => Some(value),
            None => get(&v.attrs, b)?,
        })
    };
    let input = first(
        intern!(py, "gen_ai.tool.call.arguments"),
        intern!(py, "input.value"),
    )?;
    let output = first(
        intern!(py, "gen_ai.tool.call.result"),
        intern!(py, "output.value"),
    )?;
    let io = (unwrap(input, hooks)?, unwrap(output, hooks)?);
    cache.insert(index, io.clone());
    Ok(io)
}

struct Open {
    llm: usize,
    names: Vec<String>,
}

/// steps.py `_RoundMatcher`: pairs each TOOL span with the LLM output call that issued it.
struct Rounds<'a, 'py> {
    views: &'a [View<'py>],
    by_id: FnvMap<&'a str, usize>,
    open: Vec<Open>,
}

impl<'a, 'py> Rounds<'a, 'py> {
    fn new(
        views: &'a [View<'py>],
        llm_calls: &'a [(usize, Vec<Call<'py>>)],
        hooks: &Hooks<'py>,
    ) -> Res<Self> {
        let mut by_id = FnvMap::default();
        let mut open = Vec::with_capacity(llm_calls.len());
        for (llm, calls) in llm_calls {
            for call in calls {
                if let Some(id) = &call.call_id {
                    by_id.insert(id.as_str(), *llm);
                }
            }
            let names = calls
                .iter()
                .map(|c| normalise(&c.name, hooks))
                .collect::<Res<Vec<_>>>()?;
            open.push(Open { llm: *llm, names });
        }
        Ok(Rounds { views, by_id, open })
    }

    fn claim(&mut self, index: usize, name: &str, hooks: &Hooks<'py>) -> Res<Option<usize>> {
        let span = &self.views[index];
        if !self.by_id.is_empty() {
            let py = span.attrs.py();
            let call_id = match get(&span.attrs, intern!(py, "gen_ai.tool.call.id"))? {
                Some(id) => Some(id),
                None => get(&span.attrs, intern!(py, "tool.call.id"))?,
            };
            if let Some(call_id) = call_id {
                let key = call_id.str()?;
                let key = key.to_str().map_err(|_| Unhandled::Value)?;
                if let Some(&llm) = self.by_id.get(key) {
                    let wanted = normalise(name, hooks)?;
                    let llm_span = self.views[llm].span();
                    let views = self.views;
                    if let Some(entry) = self
                        .open
                        .iter_mut()
                        .find(|e| views[e.llm].span() == llm_span && e.names.contains(&wanted))
                    {
                        remove_first(&mut entry.names, &wanted);
                    }
                    return Ok(Some(llm));
                }
            }
        }
        let wanted = normalise(name, hooks)?;
        for entry in self.open.iter_mut().rev() {
            let llm = &self.views[entry.llm];
            if entry.names.contains(&wanted)
                && step_order(llm, span) == Ordering::Less
                && llm.trace() == span.trace()
            {
                remove_first(&mut entry.names, &wanted);
                return Ok(Some(entry.llm));
            }
        }
        Ok(None)
    }
}

fn remove_first(names: &mut Vec<String>, wanted: &str) {
    if let Some(at) = names.iter().position(|n| n == wanted) {
        names.remove(at);
    }
}

/// trajectory_build.py `_count`, in i128 (Unhandled where Python's unbounded ints could differ).
fn count(value: &Bound<'_, PyAny>) -> Res<i128> {
    if value.is_exact_instance_of::<PyInt>() {
        return Ok(int_of(value).ok_or(Unhandled::Value)?.max(0));
    }
    if value.is_instance_of::<pyo3::types::PyBool>() {
        return Ok(0);
    }
    if value.is_instance_of::<PyInt>() {
        return Err(Unhandled::Value); // an int subclass: Python's own rules
    }
    if let Ok(f) = value.downcast::<pyo3::types::PyFloat>() {
        let f = f.value();
        if f.is_finite() && f.fract() == 0.0 {
            if f.abs() >= 9.0e18 {
                return Err(Unhandled::Value);
            }
            return Ok((f as i128).max(0));
        }
        return Ok(0);
    }
    if let Ok(s) = value.downcast::<PyString>() {
        let t = s.to_str().map_err(|_| Unhandled::Value)?;
        if !t.is_ascii() {
            return Err(Unhandled::Value); // str.isdigit() admits other digits, int() may not
        }
        if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
            return t.parse::<i64>().map(i128::from).map_err(|_| Unhandled::Value);
        }
        return Ok(0);
    }
    Ok(0)
}

/// (steps, trajectory steps, input tokens, output tokens, latency ns or None, final answer or None)
pub type Observed<'py> = (
    Bound<'py, PyList>,
    Bound<'py, PyList>,
    i128,
    i128,
    Option<i128>,
    Bound<'py, PyAny>,
);

pub fn observe<'py>(spans: &Bound<'py, PyList>, hooks: &Hooks<'py>) -> Res<Observed<'py>> {
    let views = spans.iter().map(|s| view(&s)).collect::<Res<Vec<_>>>()?;
    observe_views(spans.py(), &views, hooks)
}

/// `observe` of spans already read into views (in the partition's span order, as the spans
/// `observe` is given): the fused close-time read builds them from the wire, not from Spans.
pub(crate) fn observe_views<'py>(
    py: Python<'py>,
    views: &[View<'py>],
    hooks: &Hooks<'py>,
) -> Res<Observed<'py>> {
    let present: FnvSet<(&str, &str)> = views.iter().map(|v| (v.trace(), v.span())).collect();
    let is_root = |v: &View<'_>| match v.parent() {
        None => true,
        Some(parent) => !present.contains(&(v.trace(), parent)),
    };
    let mut io_cache = FnvMap::default();

    // steps.py extract_steps_from_spans: one pass classifies each span once
    let mut step_spans: Vec<(usize, Kind)> = Vec::new();
    let mut llm_calls: Vec<(usize, Vec<Call<'py>>)> = Vec::new();
    let mut roots: Vec<usize> = Vec::new();
    for (i, v) in views.iter().enumerate() {
        let root = is_root(v);
        if root {
            roots.push(i);
        }
        let kind = if root { None } else { step_kind(&v.attrs)? };
        let calls = embedded_calls(v, hooks)?;
        if let Some(kind) = kind {
            step_spans.push((i, kind));
        }
        if !calls.is_empty() {
            llm_calls.push((i, calls));
        }
    }
    llm_calls.sort_by(|a, b| step_order(&views[a.0], &views[b.0]));
    let steps = PyList::empty(py);
    let tool = intern!(py, "TOOL");
    // each embedded call as a TOOL step, with the index of the LLM span that issued it
    let embedded = |calls: &[(usize, Vec<Call<'py>>)]| -> Res<Vec<(usize, Bound<'py, PyAny>)>> {
        let mut out = Vec::new();
        for (i, calls) in calls {
            let v = &views[*i];
            for call in calls {
                out.push((
                    *i,
                    hooks.new_step(
                        &call.name_py,
                        tool,
                        &v.trace_py,
                        &v.span_py,
                        &v.start_py,
                        &call.arguments,
                        &py.None().into_bound(py),
                        &v.span_py,
                    )?,
                ));
            }
        }
        Ok(out)
    };
    if step_spans.is_empty() {
        for (_, step) in embedded(&llm_calls)? {
            steps.append(step)?;
        }
    } else {
        // rule 1 per trace: a trace (of a session) without TOOL/AGENT spans has its embedded calls
        let (llm_calls, embedded_only): (Vec<_>, Vec<_>) = if llm_calls.is_empty() {
            (llm_calls, Vec::new())
        } else {
            let step_traces: FnvSet<&str> = step_spans.iter().map(|(i, _)| views[*i].trace()).collect();
            llm_calls
                .into_iter()
                .partition(|(i, _)| step_traces.contains(views[*i].trace()))
        };
        step_spans.sort_by(|a, b| step_order(&views[a.0], &views[b.0]));
        let mut ordered: Vec<(usize, Bound<'py, PyAny>)> = Vec::with_capacity(step_spans.len());
        let mut rounds = Rounds::new(views, &llm_calls, hooks)?;
        let agent = intern!(py, "AGENT");
        for &(i, kind) in &step_spans {
            let v = &views[i];
            let (name_py, kind_py, input, output, round) = if kind == Kind::Tool {
                let name_py = tool_step_name(v)?;
                let (input, output) = tool_io(v, i, &mut io_cache, hooks)?;
                let round = rounds.claim(i, utf8(&name_py), hooks)?;
                (name_py, tool, input, output, round)
            } else {
                let name_py = agent_step_name(v)?;
                let input = unwrap(get(&v.attrs, intern!(py, "input.value"))?, hooks)?;
                let output = unwrap(get(&v.attrs, intern!(py, "output.value"))?, hooks)?;
                (name_py, agent, input, output, None)
            };
            let round_py = match round {
                Some(llm) => views[llm].span_py.clone().into_any(),
                None => py.None().into_bound(py),
            };
            ordered.push((
                i,
                hooks.new_step(
                    &name_py,
                    kind_py,
                    &v.trace_py,
                    &v.span_py,
                    &v.start_py,
                    &input,
                    &output,
                    &round_py,
                )?,
            ));
        }
        if !embedded_only.is_empty() {
            ordered.extend(embedded(&embedded_only)?);
            // stable: the span steps first on a tie, a span's calls in their (N, M) order
            ordered.sort_by(|a, b| step_order(&views[a.0], &views[b.0]));
        }
        for (_, step) in ordered {
            steps.append(step)?;
        }
    }

    // trajectory_build.py build_trajectory_from_spans
    let mut calls: Vec<usize> = Vec::new();
    let (mut input_tokens, mut output_tokens) = (0i128, 0i128);
    let (mut first_start, mut last_end): (Option<i128>, Option<i128>) = (None, None);
    for (i, v) in views.iter().enumerate() {
        let attrs = &v.attrs;
        let is_call = attrs.contains(intern!(py, "gen_ai.tool.name"))?
            || match get(attrs, intern!(py, "openinference.span.kind"))? {
                Some(kind) => upper_is(&kind, "TOOL")?,
                None => false,
            };
        if is_call {
            calls.push(i);
        }
        let input = match get(attrs, intern!(py, "gen_ai.usage.input_tokens"))? {
            Some(value) => Some(value),
            None => get(attrs, intern!(py, "llm.token_count.prompt"))?,
        };
        let output = match get(attrs, intern!(py, "gen_ai.usage.output_tokens"))? {
            Some(value) => Some(value),
            None => get(attrs, intern!(py, "llm.token_count.completion"))?,
        };
        if let Some(value) = input {
            input_tokens = input_tokens.checked_add(count(&value)?).ok_or(Unhandled::Value)?;
        }
        if let Some(value) = output {
            output_tokens = output_tokens
                .checked_add(count(&value)?)
                .ok_or(Unhandled::Value)?;
        }
        if let Some(start) = v.start {
            first_start = Some(first_start.map_or(start, |f| f.min(start)));
        }
        if let Some(end) = v.end {
            last_end = Some(last_end.map_or(end, |l| l.max(end)));
        }
    }
    calls.sort_by(|a, b| span_order(&views[*a], &views[*b]));
    let trajectory = PyList::empty(py);
    for &i in &calls {
        let v = &views[i];
        let (input, output) = tool_io(v, i, &mut io_cache, hooks)?;
        let name_py = tool_step_name(v)?;
        trajectory.append(hooks.new_trajectory_step(&name_py, &input, &output)?)?;
    }
    roots.sort_by(|a, b| span_order(&views[*a], &views[*b]));
    let mut answer = py.None().into_bound(py);
    let mut untimed: Option<Bound<'py, PyAny>> = None;
    for &i in roots.iter().rev() {
        let v = &views[i];
        let value = match get(&v.attrs, intern!(py, "output.value"))? {
            Some(value) => value,
            None => match get(&v.attrs, intern!(py, "gen_ai.completion"))? {
                Some(value) => value,
                None => continue,
            },
        };
        let text = if value.downcast::<PyString>().is_ok() {
            value
        } else {
            hooks.json_dumps.call1((value,))?
        };
        if v.start.is_some() {
            untimed = None;
            answer = text;
            break;
        }
        if untimed.is_none() {
            untimed = Some(text);
        }
    }
    if let Some(text) = untimed {
        answer = text;
    }
    let latency = match (first_start, last_end) {
        (Some(start), Some(end)) => Some((end - start).max(0)),
        _ => None,
    };
    Ok((steps, trajectory, input_tokens, output_tokens, latency, answer))
}
