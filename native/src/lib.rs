//! `stepwatch.receiver._spancore`: the per-span work of ingest and close-time decoding, moved out
//! of Python. The Python binding (receiver/spancore.py) owns the fallback: every function here
//! returns None where the pure-Python path must decide (bytes it does not handle, a Python
//! callback that raised), so results are the pure-Python path's, only faster.

use std::collections::HashMap;

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyBytes, PyDict, PyList, PySet, PyString, PyTuple};

pub mod align;
pub mod index;
pub mod lean;
pub mod observe;
pub mod partition;
pub mod validate;
pub mod wire;

/// mimalloc for the extension's own allocations (the parsed entries, the step and alignment
/// vectors): glibc's `_int_malloc` on serve's long-lived, fragmented heap cost ~2 us a block and
/// ~5% of serve's CPU in a profile (docs/serve.md). Python's objects keep Python's allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use index::Pieces;
use lean::Simple;

const ROOT_ENDED: u8 = 1;
const SPAN_KINDS: [&str; 6] = [
    "UNSPECIFIED",
    "INTERNAL",
    "SERVER",
    "CLIENT",
    "PRODUCER",
    "CONSUMER",
];
const STATUS_CODES: [&str; 3] = ["UNSET", "OK", "ERROR"];
/// What every close-time call builds from the same constants, made once per interpreter instead of
/// per call: `object.__new__` (looked up through the import machinery, ~2 us a call), the kind and
/// status code strings, and the presized field dict each span's fields are copied from. A profile of
/// one-span partitions put this set-up at a third of the call.
struct Constants {
    object_new: Py<PyAny>,
    kinds: Vec<Py<PyString>>,
    codes: Vec<Py<PyString>>,
    template: Py<PyDict>,
    empty: Py<PyString>,
}

fn constants(py: Python<'_>) -> PyResult<&Constants> {
    static CELL: GILOnceCell<Constants> = GILOnceCell::new();
    CELL.get_or_try_init(py, || {
        let strings = |names: &[&str]| names.iter().map(|n| PyString::intern(py, n).unbind()).collect();
        let template = PyDict::new(py);
        for key in FIELDS {
            template.set_item(PyString::intern(py, key), py.None())?;
        }
        Ok(Constants {
            object_new: py
                .import("builtins")?
                .getattr("object")?
                .getattr("__new__")?
                .unbind(),
            kinds: strings(&SPAN_KINDS),
            codes: strings(&STATUS_CODES),
            template: template.unbind(),
            empty: PyString::intern(py, "").unbind(),
        })
    })
}

/// The canonical Span's fields in declaration order (its `__dict__` order, as new_span builds it).
const FIELDS: [&str; 13] = [
    "trace_id",
    "span_id",
    "parent_span_id",
    "name",
    "kind",
    "start_time_unix_nano",
    "end_time_unix_nano",
    "status_code",
    "status_message",
    "attributes",
    "resource_attributes",
    "scope_name",
    "seq",
];

fn pieces<'py>(py: Python<'py>, data: &[u8], pieces: &Pieces) -> Bound<'py, PyBytes> {
    match pieces.0.as_slice() {
        [] => PyBytes::new(py, b""),
        [(start, end)] => PyBytes::new(py, &data[*start..*end]),
        many => {
            let joined: Vec<u8> = many
                .iter()
                .flat_map(|(s, e)| data[*s..*e].iter().copied())
                .collect();
            PyBytes::new(py, &joined)
        }
    }
}

/// (records, invalid spans, total spans) of one request.
type Indexed<'py> = (Bound<'py, PyList>, Bound<'py, PyList>, usize);

/// The ingest index of one encoded ExportTraceServiceRequest, as `split_request` builds it:
/// (records of the valid spans, (trace_id, span_id, parent, name) of the invalid ones, total),
/// or None when the bytes are not handled here (the caller then walks the parsed request).
/// A record is (trace_id, span_id, flags, encoded span, origin); origin is one
/// (resource bytes, scope bytes) tuple shared by the spans of a ScopeSpans.
///
/// With `schema` (a RequestSchema) the whole request is also checked the way upb parses it, and
/// None is returned unless upb is known to accept it: the index then stands in for the parse.
#[pyfunction]
#[pyo3(signature = (data, schema=None))]
fn index_request<'py>(
    py: Python<'py>,
    data: &[u8],
    schema: Option<&RequestSchema>,
) -> PyResult<Option<Indexed<'py>>> {
    let found = match schema {
        Some(schema) => index::index_checked(data, &schema.0),
        None => index::index(data),
    };
    let Ok(found) = found else {
        return Ok(None);
    };
    let mut rejected: Vec<Bound<'py, PyTuple>> = Vec::new();
    for span in found.spans.iter().filter(|s| !index::is_valid(data, s)) {
        let Ok(name) = std::str::from_utf8(&data[span.name.0..span.name.1]) else {
            return Ok(None);
        };
        let ids = [span.trace_id, span.span_id, span.parent].map(|(s, e)| PyBytes::new(py, &data[s..e]));
        let [trace, id, parent] = ids;
        rejected.push(PyTuple::new(
            py,
            [
                trace.into_any(),
                id.into_any(),
                parent.into_any(),
                PyString::new(py, name).into_any(),
            ],
        )?);
    }
    let resources: Vec<Bound<'py, PyBytes>> = found.resources.iter().map(|r| pieces(py, data, r)).collect();
    let origins = found
        .origins
        .iter()
        .map(|o| PyTuple::new(py, [resources[o.resource].clone(), pieces(py, data, &o.scope)]).map(untracked))
        .collect::<PyResult<Vec<_>>>()?;
    let records = PyList::empty(py);
    for span in found.spans.iter().filter(|s| index::is_valid(data, s)) {
        let flags = if span.parent.1 == span.parent.0 && span.end_time != 0 {
            ROOT_ENDED
        } else {
            0
        };
        let record = PyTuple::new(
            py,
            [
                PyBytes::new(py, &data[span.trace_id.0..span.trace_id.1]).into_any(),
                PyBytes::new(py, &data[span.span_id.0..span.span_id.1]).into_any(),
                flags.into_pyobject(py)?.into_any(),
                PyBytes::new(py, &data[span.extent.0..span.extent.1]).into_any(),
                origins[span.origin].clone().into_any(),
            ],
        )?;
        records.append(untracked(record))?;
    }
    Ok(Some((records, PyList::new(py, rejected)?, found.spans.len())))
}

/// `tuple` taken out of the cycle collector's view. Records and origins hold only bytes, ints and
/// other untracked tuples, so no reference cycle can pass through them; CPython would untrack
/// them itself, but only at the first collection they survive. Tracked, the records a buffer holds
/// made a young-generation collection (~10 ms) every ~20,000 spans, each walking every record that
/// had arrived since the last one; untracked, they never count towards a collection at all.
fn untracked(tuple: Bound<'_, PyTuple>) -> Bound<'_, PyTuple> {
    // SAFETY: a valid tuple we own a reference to, with the GIL held (Bound); untracking an
    // untracked object is a no-op.
    unsafe { pyo3::ffi::PyObject_GC_UnTrack(tuple.as_ptr().cast()) };
    tuple
}

/// The schema `index_request` checks a request against: (message count, rows of (message,
/// field number, kind code, nested message)) as receiver/spancore.py builds them from the
/// protobuf descriptors (kind codes in validate::Schema::from_rows).
#[pyclass(frozen, module = "stepwatch.receiver._spancore")]
struct RequestSchema(validate::Schema);

#[pymethods]
impl RequestSchema {
    #[new]
    fn new(count: usize, rows: Vec<(usize, u32, u8, usize)>) -> PyResult<Self> {
        validate::Schema::from_rows(count, &rows)
            .map(RequestSchema)
            .ok_or_else(|| PyValueError::new_err("a schema row is out of range"))
    }

    /// Whether upb is known to accept `data` (False: let upb parse it and decide).
    fn accepts(&self, data: &[u8]) -> bool {
        self.0.check(data).is_ok()
    }
}

/// FNV-1a: the selector's keys are a few dozen short trusted strings, looked up once per attribute;
/// SipHash's DoS resistance buys nothing here and cost a tenth of the reader.
#[derive(Default)]
pub(crate) struct Fnv(u64);

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut hash = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &byte in bytes {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = hash;
    }
}

type FnvMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<Fnv>>;

/// An `AttributeSelection` prepared once: exact keys (their Python strings reused as dict keys)
/// and prefixes.
#[pyclass(frozen, module = "stepwatch.receiver._spancore")]
struct Selector {
    keys: FnvMap<String, Py<PyString>>,
    prefixes: Vec<String>,
    /// Bit `n` set: some exact key is `n` bytes long (longer keys: bit 127). Most attribute keys a
    /// span carries are not selected, and their length alone says so without hashing them.
    lengths: u128,
}

fn length_bit(len: usize) -> u128 {
    1u128 << len.min(127)
}

#[pymethods]
impl Selector {
    #[new]
    fn new(keys: Vec<Bound<'_, PyString>>, prefixes: Vec<String>) -> PyResult<Self> {
        let mut map = FnvMap::default();
        let mut lengths = 0u128;
        for key in keys {
            let text = key.to_str()?.to_owned();
            lengths |= length_bit(text.len());
            map.insert(text, key.unbind());
        }
        Ok(Selector {
            keys: map,
            prefixes,
            lengths,
        })
    }
}

impl Selector {
    fn wants(&self, key: &str) -> bool {
        (self.lengths & length_bit(key.len()) != 0 && self.keys.contains_key(key))
            || self.prefixes.iter().any(|p| key.starts_with(p.as_str()))
    }

    fn key<'py>(&self, py: Python<'py>, key: &str) -> Bound<'py, PyString> {
        match self.keys.get(key) {
            Some(text) => text.bind(py).clone(),
            None => PyString::new(py, key),
        }
    }
}

fn hex<'py>(py: Python<'py>, bytes: &[u8]) -> Bound<'py, PyString> {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(DIGITS[usize::from(byte >> 4)] as char);
        out.push(DIGITS[usize::from(byte & 15)] as char);
    }
    PyString::new(py, &out)
}

fn hex_cached<'py, 'a>(
    py: Python<'py>,
    ids: &mut FnvMap<&'a [u8], Bound<'py, PyString>>,
    bytes: &'a [u8],
) -> Bound<'py, PyString> {
    ids.entry(bytes).or_insert_with(|| hex(py, bytes)).clone()
}

fn simple_value<'py>(py: Python<'py>, value: Simple<'_>) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Simple::None => py.None().into_bound(py),
        Simple::Str(text) => PyString::new(py, text).into_any(),
        Simple::Int(n) => n.into_pyobject(py)?.into_any(),
        Simple::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Simple::Double(d) => d.into_pyobject(py)?.into_any(),
    })
}

/// How a field dict becomes a Span: `make(fields)`, or with `model` = (class, fields set) what
/// evaluator.model.construct does (object.__new__, then __dict__, __pydantic_fields_set__,
/// __pydantic_extra__ = None, __pydantic_private__ = None), without two Python frames per span.
struct Maker<'py> {
    make: Bound<'py, PyAny>,
    model: Option<(Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>)>,
}

impl<'py> Maker<'py> {
    fn new(
        py: Python<'py>,
        make: &Bound<'py, PyAny>,
        model: Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
    ) -> PyResult<Self> {
        let model = match model {
            None => None,
            Some((cls, fields_set)) => Some((cls, fields_set, constants(py)?.object_new.bind(py).clone())),
        };
        Ok(Maker {
            make: make.clone(),
            model,
        })
    }

    fn make(&self, fields: Bound<'py, PyDict>) -> PyResult<Bound<'py, PyAny>> {
        let Some((cls, fields_set, new)) = &self.model else {
            return self.make.call1((fields,));
        };
        let py = fields.py();
        let obj = new.call1((cls,))?;
        let none = py.None().into_bound(py);
        observe::set_field(&obj, intern!(py, "__dict__"), &fields)?;
        observe::set_field(&obj, intern!(py, "__pydantic_fields_set__"), fields_set)?;
        observe::set_field(&obj, intern!(py, "__pydantic_extra__"), &none)?;
        observe::set_field(&obj, intern!(py, "__pydantic_private__"), &none)?;
        Ok(obj)
    }
}

/// The per-span limits (`decode_records_for_limits`): (most encoded bytes of a value no
/// value-length limit can touch, max attribute value length, max JSON depth).
#[derive(Clone, Copy)]
struct Limits {
    most_bytes: i64,
    max_length: i64,
    max_json_depth: i64,
}

impl Limits {
    fn new((most_bytes, max_length, max_json_depth): (i64, i64, i64)) -> Self {
        Limits {
            most_bytes,
            max_length,
            max_json_depth,
        }
    }

    /// Whether a whole decode's limits (security/limits.py `limit_spans`) would change or count
    /// any of the span's attribute values, so it must be decoded whole and limited: otlp_selective
    /// `over_limits`, the same rule. The payload's size and bracket count rule most spans out at
    /// once; otherwise each key's last value is checked: a string exactly (longer than the limit,
    /// or nested deeper as JSON), any other value by its encoded size and bracket count.
    fn touch(&self, payload: &[u8], attributes: &[(&str, &[u8])]) -> bool {
        if !self.may_touch(payload) {
            return false;
        }
        attributes.iter().enumerate().any(|(i, &(key, value))| {
            self.value_over(value) && !attributes[i + 1..].iter().any(|&(later, _)| later == key)
        })
    }

    fn may_touch(&self, bytes: &[u8]) -> bool {
        bytes.len() as i64 > self.most_bytes || brackets_over(bytes, self.max_json_depth)
    }

    fn value_over(&self, value: &[u8]) -> bool {
        match lean::simple(value) {
            Some(Simple::Str(text)) => {
                let chars = text.bytes().filter(|&b| b & 0xC0 != 0x80).count();
                chars as i64 > self.max_length
                    || (brackets_over(text.as_bytes(), self.max_json_depth)
                        && json_depth_exceeds(text.as_bytes(), self.max_json_depth))
            }
            _ => self.may_touch(value),
        }
    }
}

/// security/limits.py `json_depth_exceeds` on UTF-8 bytes (its quotes, backslashes and brackets
/// are ASCII, which no multi-byte character contains, so the byte scan is the character scan).
fn json_depth_exceeds(text: &[u8], max_depth: i64) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0i64, false, false);
    for &b in text {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if b == b'"' {
            in_string = true;
        } else if b == b'[' || b == b'{' {
            depth += 1;
            if depth > max_depth {
                return true;
            }
        } else if b == b']' || b == b'}' {
            depth -= 1;
        }
    }
    false
}

/// Whether `payload` holds more than `limit` '[' / '{' bytes: counted into a byte per lane, 255
/// bytes at a time (a loop the compiler vectorizes to 16 bytes an instruction), stopping as soon
/// as the answer is known. '[' (0x5B) and '{' (0x7B) differ only in bit 0x20, so one compare.
fn brackets_over(payload: &[u8], limit: i64) -> bool {
    if payload.len() as i64 <= limit {
        return false;
    }
    let mut count: i64 = 0;
    for chunk in payload.chunks(255) {
        let in_chunk = chunk
            .iter()
            .fold(0u8, |n, &b| n.wrapping_add(u8::from(b | 0x20 == b'{')));
        count += i64::from(in_chunk);
        if count > limit {
            return true;
        }
    }
    false
}

/// Canonical Span field dicts of a closed partition's records, as `decode_selected` builds them,
/// passed to `make` (receiver.otlp_proto.new_span); None when the Python path must decide.
///
/// `full`: indices to decode whole (by `whole(payload)`); spans with more than `max_attributes`
/// distinct attribute keys, or over the `limits` (`most_bytes`, `max_json_depth`), are added to
/// it. `origin_of(origin)` gives (resource attributes, scope name) per run of records sharing an
/// origin; `value_of(encoded)` converts the AnyValues not read here (any_value_bytes).
#[pyfunction]
#[pyo3(signature = (records, selector, full, max_attributes, limits, origin_of, value_of, whole, make, model=None))]
#[allow(clippy::too_many_arguments)]
fn read_spans<'py>(
    py: Python<'py>,
    records: &Bound<'py, PyList>,
    selector: &Selector,
    full: &Bound<'py, PySet>,
    max_attributes: usize,
    limits: Option<(i64, i64, i64)>,
    origin_of: &Bound<'py, PyAny>,
    value_of: &Bound<'py, PyAny>,
    whole: &Bound<'py, PyAny>,
    make: &Bound<'py, PyAny>,
    model: Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
) -> PyResult<Option<Bound<'py, PyList>>> {
    let maker = Maker::new(py, make, model)?;
    let limits = limits.map(Limits::new);
    let (payloads, origins) = record_parts(records)?;
    // parse everything first: bytes not handled here leave the work to Python before any callback
    let Some(parsed) = parse_all(&payloads) else {
        return Ok(None);
    };
    let mut forced: Vec<bool> = vec![false; parsed.spans.len()];
    for item in full.iter() {
        if let Ok(i) = item.extract::<usize>() {
            if i < forced.len() {
                forced[i] = true;
            }
        }
    }
    if let Some(limits) = limits {
        for (i, (payload, span)) in payloads.iter().zip(&parsed.spans).enumerate() {
            if !forced[i] && limits.touch(payload.as_bytes(), parsed.attributes(span)) {
                forced[i] = true;
                full.add(i)?;
            }
        }
    }
    match build(
        py,
        &parsed,
        &payloads,
        &origins,
        selector,
        full,
        &mut forced,
        max_attributes,
        origin_of,
        value_of,
        whole,
        &maker,
        None,
    ) {
        Ok(out) => Ok(Some(out)),
        Err(_) => Ok(None), // a callback raised: the Python path raises it in its own order
    }
}

/// (encoded span, origin) of each record.
#[allow(clippy::type_complexity)]
fn record_parts<'py>(
    records: &Bound<'py, PyList>,
) -> PyResult<(Vec<Bound<'py, PyBytes>>, Vec<Bound<'py, PyAny>>)> {
    let mut payloads: Vec<Bound<'py, PyBytes>> = Vec::with_capacity(records.len());
    let mut origins: Vec<Bound<'py, PyAny>> = Vec::with_capacity(records.len());
    for record in records.iter() {
        let record = record.downcast_into::<PyTuple>()?;
        if record.len() != 5 {
            return Err(PyValueError::new_err("a span record is a 5-tuple"));
        }
        payloads.push(record.get_item(3)?.downcast_into::<PyBytes>()?);
        origins.push(record.get_item(4)?);
    }
    Ok((payloads, origins))
}

/// Every record's span parsed; None if any is bytes not handled here (Python decides).
///
/// A closed partition's spans were buffered seconds ago and are out of the CPU caches; the parser
/// skips from field to field, so each field lands on a line the hardware prefetcher did not fetch.
/// The next span's lines are requested while this one is parsed, so its misses overlap this work
/// (a profile put half the parse on the load of each field's tag).
fn parse_all<'a>(payloads: &'a [Bound<'_, PyBytes>]) -> Option<lean::Parsed<'a>> {
    let mut parsed = lean::Parsed::with_capacity(payloads.len());
    if let Some(first) = payloads.first() {
        prefetch(first.as_bytes());
    }
    for (i, payload) in payloads.iter().enumerate() {
        if let Some(next) = payloads.get(i + 1) {
            prefetch(next.as_bytes());
        }
        parsed.push(payload.as_bytes()).ok()?;
    }
    Some(parsed)
}

/// Ask for every cache line of `bytes` (a hint: it reads nothing and cannot fault).
#[inline]
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: a prefetch of an address inside a live slice; prefetches never fault or read
        unsafe {
            std::arch::x86_64::_mm_prefetch(line.as_ptr().cast::<i8>(), std::arch::x86_64::_MM_HINT_T0)
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// More distinct attribute keys than `max_attributes` (what the dict's len() counts): decoded
/// whole, for the attributes-per-span limit.
fn too_many(attributes: &[lean::Entry<'_>], max_attributes: usize) -> bool {
    attributes.len() > max_attributes && lean::distinct_keys(attributes) > max_attributes
}

/// What the fused read (`read_observe`) keeps of each span besides its Span: the view the
/// partition fields and the steps pass read, and its resource attributes.
struct Fused<'py> {
    views: Vec<observe::View<'py>>,
    resources: Vec<Bound<'py, PyAny>>,
}

#[allow(clippy::too_many_arguments)]
fn build<'py, 'a>(
    py: Python<'py>,
    parsed: &lean::Parsed<'a>,
    payloads: &[Bound<'py, PyBytes>],
    origins: &[Bound<'py, PyAny>],
    selector: &Selector,
    full: &Bound<'py, PySet>,
    forced: &mut [bool],
    max_attributes: usize,
    origin_of: &Bound<'py, PyAny>,
    value_of: &Bound<'py, PyAny>,
    whole: &Bound<'py, PyAny>,
    maker: &Maker<'py>,
    mut fused: Option<&mut Fused<'py>>,
) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    let constants = constants(py)?;
    let (kinds, codes) = (&constants.kinds, &constants.codes);
    let template = constants.template.bind(py);
    let mut origin: Option<&Bound<'py, PyAny>> = None;
    let mut resource_attributes = py.None().into_bound(py);
    let mut scope_name = py.None().into_bound(py);
    let mut picked: Vec<(&str, &[u8])> = Vec::new();
    // ids as hex, made once per distinct id of the partition: its spans share one trace id, and
    // parents are spans of it (equal strings either way; only fewer of them are built)
    let mut ids: FnvMap<&'a [u8], Bound<'py, PyString>> = FnvMap::default();
    let empty = constants.empty.bind(py);
    for (index, span) in parsed.spans.iter().enumerate() {
        let span_attributes = parsed.attributes(span);
        let this = &origins[index];
        if !origin.is_some_and(|o| o.is(this)) {
            let pair = origin_of.call1((this,))?;
            resource_attributes = pair.get_item(0)?;
            scope_name = pair.get_item(1)?;
            if fused.is_some() && !pair.get_item(2)?.is_truthy()? {
                return Err(PyValueError::new_err(
                    "a resource over the limits: limit the spans first",
                ));
            }
            origin = Some(this);
        }
        let attributes = if forced[index] || too_many(span_attributes, max_attributes) {
            forced[index] = true;
            full.add(index)?;
            whole.call1((&payloads[index],))?
        } else {
            picked.clear();
            for &(key, value) in span_attributes {
                if selector.wants(key) {
                    match picked.iter_mut().find(|(k, _)| *k == key) {
                        Some(slot) => slot.1 = value, // the last value, at the first position
                        None => picked.push((key, value)),
                    }
                }
            }
            let dict = PyDict::new(py);
            for &(key, value) in &picked {
                let converted = if lean::is_empty(value) {
                    py.None().into_bound(py)
                } else {
                    match lean::simple(value) {
                        Some(simple) => simple_value(py, simple)?,
                        None => value_of.call1((PyBytes::new(py, value),))?,
                    }
                };
                dict.set_item(selector.key(py, key), converted)?;
            }
            dict.into_any()
        };
        let kind = usize::try_from(span.kind)
            .ok()
            .filter(|&k| k < SPAN_KINDS.len())
            .unwrap_or(0);
        let code = usize::try_from(span.status_code)
            .ok()
            .filter(|&c| c < STATUS_CODES.len())
            .unwrap_or(0);
        let fields = template.copy()?; // presized: no resizing per span
        let trace_py = hex_cached(py, &mut ids, span.trace_id);
        let span_py = hex_cached(py, &mut ids, span.span_id);
        let parent_py =
            (!span.parent_span_id.is_empty()).then(|| hex_cached(py, &mut ids, span.parent_span_id));
        let name_py = PyString::new(py, span.name);
        let start_py = time_value(py, span.start_time)?;
        fields.set_item(intern!(py, "trace_id"), &trace_py)?;
        fields.set_item(intern!(py, "span_id"), &span_py)?;
        match &parent_py {
            None => fields.set_item(intern!(py, "parent_span_id"), py.None())?,
            Some(parent) => fields.set_item(intern!(py, "parent_span_id"), parent)?,
        }
        fields.set_item(intern!(py, "name"), &name_py)?;
        fields.set_item(intern!(py, "kind"), kinds[kind].bind(py))?;
        fields.set_item(intern!(py, "start_time_unix_nano"), &start_py)?;
        fields.set_item(intern!(py, "end_time_unix_nano"), time_value(py, span.end_time)?)?;
        fields.set_item(intern!(py, "status_code"), codes[code].bind(py))?;
        if span.status_message.is_empty() {
            fields.set_item(intern!(py, "status_message"), empty)?;
        } else {
            fields.set_item(intern!(py, "status_message"), span.status_message)?;
        }
        fields.set_item(intern!(py, "attributes"), &attributes)?;
        fields.set_item(intern!(py, "resource_attributes"), &resource_attributes)?;
        fields.set_item(intern!(py, "scope_name"), &scope_name)?;
        fields.set_item(intern!(py, "seq"), index)?;
        if let Some(fused) = fused.as_deref_mut() {
            let time = |nanos: u64| (nanos != 0).then_some(i128::from(nanos));
            fused.views.push(observe::View {
                attrs: attributes.downcast_into::<PyDict>()?,
                trace_py,
                span_py,
                parent_py,
                name_py,
                start_py,
                start: time(span.start_time),
                end: time(span.end_time),
                seq: index as i128,
            });
            fused.resources.push(resource_attributes.clone());
        }
        out.append(maker.make(fields)?)?;
    }
    Ok(out)
}

/// A span time as the canonical Span holds it: None for 0 (unset), else the int.
fn time_value(py: Python<'_>, nanos: u64) -> PyResult<Bound<'_, PyAny>> {
    if nanos == 0 {
        Ok(py.None().into_bound(py))
    } else {
        Ok(nanos.into_pyobject(py)?.into_any())
    }
}

/// evaluator/scorers/step_accuracy.py `bare_entries`: (edit distance, the metadata's `steps`
/// entries) of a group-free alignment of `expected` names with `observed` Steps, the same dicts in
/// the same order. `normalise`: evaluator.model.normalise_tool_name (a TOOL step's key, and what an
/// expected name matches a TOOL step by). None where Python must decide (a token not a str).
#[pyfunction]
fn bare_entries<'py>(
    py: Python<'py>,
    expected: &Bound<'py, PyList>,
    observed: &Bound<'py, PyList>,
    normalise: &Bound<'py, PyAny>,
) -> PyResult<Option<(i64, Bound<'py, PyList>)>> {
    let tool = intern!(py, "TOOL");
    // observed steps by (is a tool, key): ids as alignment.py's vocabulary gives them
    let mut names: Vec<Bound<'py, PyString>> = Vec::with_capacity(observed.len());
    let mut keys: Vec<(bool, Bound<'py, PyString>)> = Vec::with_capacity(observed.len());
    for step in observed.iter() {
        let Ok(name) = step.getattr(intern!(py, "name"))?.downcast_into::<PyString>() else {
            return Ok(None);
        };
        let is_tool = step.getattr(intern!(py, "kind"))?.eq(tool)?;
        let key = if is_tool {
            let Ok(key) = normalise.call1((&name,))?.downcast_into::<PyString>() else {
                return Ok(None);
            };
            key
        } else {
            name.clone()
        };
        names.push(name);
        keys.push((is_tool, key));
    }
    let mut vocab: FnvMap<(bool, &str), i64> = FnvMap::default();
    let mut obs: Vec<i64> = Vec::with_capacity(keys.len());
    for (is_tool, key) in &keys {
        let next = vocab.len() as i64;
        obs.push(*vocab.entry((*is_tool, key.to_str()?)).or_insert(next));
    }
    let mut tokens: Vec<Bound<'py, PyString>> = Vec::with_capacity(expected.len());
    let mut same: Vec<(i64, i64)> = Vec::with_capacity(expected.len());
    for token in expected.iter() {
        let Ok(token) = token.downcast_into::<PyString>() else {
            return Ok(None);
        };
        let Ok(normalised) = normalise.call1((&token,))?.downcast_into::<PyString>() else {
            return Ok(None);
        };
        let tool_id = vocab.get(&(true, normalised.to_str()?)).copied().unwrap_or(-1);
        let agent_id = vocab.get(&(false, token.to_str()?)).copied().unwrap_or(-1);
        same.push((tool_id, agent_id));
        tokens.push(token);
    }
    let (distance, aligned) = align::bare_alignment(&same, &obs);
    let none = py.None().into_bound(py);
    let entries = PyList::empty(py);
    for step in aligned {
        let (op, token, index) = match step {
            align::Aligned::Match(i, j) => (intern!(py, "match"), Some(i), Some(j)),
            align::Aligned::Substitute(i, j) => (intern!(py, "substitute"), Some(i), Some(j)),
            align::Aligned::Delete(i) => (intern!(py, "delete"), Some(i), None),
            align::Aligned::Insert(j) => (intern!(py, "insert"), None, Some(j)),
        };
        let entry = PyDict::new(py);
        entry.set_item(intern!(py, "op"), op)?;
        match token {
            Some(i) => entry.set_item(intern!(py, "expected"), &tokens[i])?,
            None => entry.set_item(intern!(py, "expected"), &none)?,
        }
        match index {
            Some(j) => {
                entry.set_item(intern!(py, "actual"), &names[j])?;
                entry.set_item(intern!(py, "observed_index"), j)?;
            }
            None => {
                entry.set_item(intern!(py, "actual"), &none)?;
                entry.set_item(intern!(py, "observed_index"), &none)?;
            }
        }
        entries.append(entry)?;
    }
    Ok(Some((distance, entries)))
}

/// evaluator/pipeline.py's steps and trajectory of a partition's canonical spans (native/src/
/// observe.rs): (steps, trajectory steps, input tokens, output tokens, latency ns, final answer),
/// or None where the Python reference must decide. `hooks`: (unwrap_json, genai_tool_calls,
/// normalise_tool_name, json.dumps); `step`: the Step class; `trajectory_step`: (TrajectoryStep,
/// the fields set its instances share).
#[pyfunction(name = "observe")]
fn observe_spans<'py>(
    py: Python<'py>,
    spans: &Bound<'py, PyList>,
    hooks: (
        Bound<'py, PyAny>,
        Bound<'py, PyAny>,
        Bound<'py, PyAny>,
        Bound<'py, PyAny>,
    ),
    step: Bound<'py, PyAny>,
    trajectory_step: (Bound<'py, PyAny>, Bound<'py, PyAny>),
) -> PyResult<Option<observe::Observed<'py>>> {
    let hooks = observe_hooks(py, hooks, step, trajectory_step)?;
    Ok(observe::observe(spans, &hooks).ok())
}

/// The evaluator's functions (unwrap_json, genai_tool_calls, normalise_tool_name, json.dumps)
/// and classes (Step; TrajectoryStep and its shared fields set) the steps pass calls and builds.
type HookArgs<'py> = (
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
);

fn observe_hooks<'py>(
    py: Python<'py>,
    hooks: HookArgs<'py>,
    step: Bound<'py, PyAny>,
    trajectory_step: (Bound<'py, PyAny>, Bound<'py, PyAny>),
) -> PyResult<observe::Hooks<'py>> {
    let (unwrap_json, genai_tool_calls, normalise_tool_name, json_dumps) = hooks;
    Ok(observe::Hooks {
        unwrap_json,
        genai_tool_calls,
        normalise_tool_name,
        step,
        trajectory_step,
        json_dumps,
        object_new: constants(py)?.object_new.bind(py).clone(),
    })
}

/// (partition fields, observed): `read_spans`, then `partition_fields` of the Spans and
/// `observe` of them in span order, in one pass that reads each span's view from the wire
/// instead of from its Span. None where a span would need the per-span limits (decoded whole,
/// or `origin_of(origin)`'s third item false: a resource over them) or a pass gives up: the
/// caller then runs the three steps apart (and the limits between them).
#[pyfunction]
#[pyo3(signature = (records, selector, max_attributes, limits, origin_of, value_of, model, task_key_attributes, want_session, hooks, step, trajectory_step))]
#[allow(clippy::too_many_arguments)]
fn read_observe<'py>(
    py: Python<'py>,
    records: &Bound<'py, PyList>,
    selector: &Selector,
    max_attributes: usize,
    limits: (i64, i64, i64),
    origin_of: &Bound<'py, PyAny>,
    value_of: &Bound<'py, PyAny>,
    model: (Bound<'py, PyAny>, Bound<'py, PyAny>),
    task_key_attributes: Vec<Bound<'py, PyString>>,
    want_session: bool,
    hooks: HookArgs<'py>,
    step: Bound<'py, PyAny>,
    trajectory_step: (Bound<'py, PyAny>, Bound<'py, PyAny>),
) -> PyResult<Option<(partition::Fields<'py>, observe::Observed<'py>)>> {
    let hooks = observe_hooks(py, hooks, step, trajectory_step)?;
    let maker = Maker::new(py, &py.None().into_bound(py), Some(model))?;
    let (payloads, origins) = record_parts(records)?;
    let Some(parsed) = parse_all(&payloads) else {
        return Ok(None);
    };
    let limits = Limits::new(limits);
    let limited = |(span, payload): (&lean::LeanSpan<'_>, &Bound<'py, PyBytes>)| {
        let attributes = parsed.attributes(span);
        limits.touch(payload.as_bytes(), attributes) || too_many(attributes, max_attributes)
    };
    if parsed.spans.iter().zip(&payloads).any(limited) {
        return Ok(None);
    }
    let mut fused = Fused {
        views: Vec::with_capacity(parsed.spans.len()),
        resources: Vec::with_capacity(parsed.spans.len()),
    };
    let mut forced = vec![false; parsed.spans.len()];
    let unused = PySet::empty(py)?;
    let Ok(out) = build(
        py,
        &parsed,
        &payloads,
        &origins,
        selector,
        &unused,
        &mut forced,
        max_attributes,
        origin_of,
        value_of,
        &py.None().into_bound(py),
        &maker,
        Some(&mut fused),
    ) else {
        return Ok(None);
    };
    let Fused { views, resources } = fused;
    let Ok((order, task_key, session, trace_ids, annotation)) = partition::fields_of_views(
        py,
        &views,
        |i| Ok(resources[i].clone()),
        &task_key_attributes,
        want_session,
        &hooks.json_dumps,
    ) else {
        return Ok(None);
    };
    let in_order: Vec<observe::View<'py>> = order.iter().map(|&i| views[i].clone()).collect();
    let Ok(observed) = observe::observe_views(py, &in_order, &hooks) else {
        return Ok(None);
    };
    let ordered = PyList::new(
        py,
        order
            .iter()
            .map(|&i| out.get_item(i))
            .collect::<PyResult<Vec<_>>>()?,
    )?;
    Ok(Some((
        (ordered, task_key, session, trace_ids, annotation),
        observed,
    )))
}

/// evaluator/partitioning.py `build_partition`'s fields of a partition's spans (native/src/
/// partition.rs), or None where the Python reference must decide.
#[pyfunction]
fn partition_fields<'py>(
    spans: &Bound<'py, PyList>,
    task_key_attributes: Vec<Bound<'py, PyString>>,
    want_session: bool,
    json_dumps: &Bound<'py, PyAny>,
) -> Option<partition::Fields<'py>> {
    partition::partition_fields(spans, &task_key_attributes, want_session, json_dumps).ok()
}

/// `zlib.crc32(data, value)` (CRC-32/IEEE, continued from `value`), with the CPU's carry-less
/// multiply where it has one (several times zlib's speed on the write-ahead log's records).
#[pyfunction]
#[pyo3(signature = (data, value=0))]
fn crc32(data: &[u8], value: u32) -> u32 {
    let mut hasher = crc32fast::Hasher::new_with_initial(value);
    hasher.update(data);
    hasher.finalize()
}

#[pymodule]
fn _spancore(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(index_request, m)?)?;
    m.add_function(wrap_pyfunction!(read_spans, m)?)?;
    m.add_function(wrap_pyfunction!(bare_entries, m)?)?;
    m.add_function(wrap_pyfunction!(crc32, m)?)?;
    m.add_function(wrap_pyfunction!(observe_spans, m)?)?;
    m.add_function(wrap_pyfunction!(partition_fields, m)?)?;
    m.add_function(wrap_pyfunction!(read_observe, m)?)?;
    m.add_class::<Selector>()?;
    m.add_class::<RequestSchema>()?;
    m.add("ABI_VERSION", 5)?;
    m.add("SPAN_FIELDS", FIELDS.to_vec())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(text: &str) -> Vec<u8> {
        let mut out = vec![0x0A, text.len() as u8];
        out.extend_from_slice(text.as_bytes());
        out
    }

    #[test]
    fn json_depth_is_the_scan_of_security_limits() {
        assert!(!json_depth_exceeds(b"[[1], [2], {\"a\": [3]}]", 3));
        assert!(json_depth_exceeds(b"[[1], [2], {\"a\": [3]}]", 2));
        assert!(json_depth_exceeds(b"[[[1]]]", 2));
        assert!(!json_depth_exceeds(br#"["[[[[", "\"{{{{"]"#, 1)); // brackets inside strings
        assert!(json_depth_exceeds(b"[[ {{ ]]", 3)); // not JSON, but four levels open
    }

    #[test]
    fn limits_touch_only_values_over_them() {
        let limits = Limits::new(((10 - 4) * 3 / 4, 10, 2));
        let (at, over) = (string(&"é".repeat(10)), string(&"é".repeat(11)));
        let payload = [0u8; 64]; // long enough to need the per-value check
        assert!(!limits.touch(&payload, &[("k", &at)])); // 10 characters in 20 bytes
        assert!(limits.touch(&payload, &[("k", &over)]));
        assert!(!limits.touch(&payload, &[("k", &over), ("k", &at)])); // the last value counts
        assert!(limits.touch(&payload, &[("k", &string("[[[1]]]"))]));
        assert!(!limits.touch(&payload, &[("k", &string("[[],[]]"))]));
        assert!(limits.touch(&payload, &[("k", b"\x2a\x09\x0a\x07aaaaaaa")])); // an array: its size
        assert!(!limits.touch(&over, &[])); // a short payload holds nothing over
    }
}
