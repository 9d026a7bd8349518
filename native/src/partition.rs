//! A partition's fields from its canonical spans: evaluator/partitioning.py `build_partition`'s
//! sort, task key, session id, trace ids and expected-steps annotation (the reference this must
//! equal, tests/native/test_observe.py), for the same spans the steps pass then reads.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use crate::observe::{get, is_empty_str, span_order, view, FnvSet, Res, Unhandled, View};

/// (spans in span order, task key, session id, trace ids, expected-steps annotation or None) of
/// partitioning.py `build_partition`: its sort, `resolve_task_key`, `session_id_of` (asked for
/// with `want_session`), trace ids in order and `_annotations`.
pub type Fields<'py> = (
    Bound<'py, PyList>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyList>,
    Bound<'py, PyAny>,
);

/// `Fields` with the span order as indices into the views read.
type Derived<'py> = (
    Vec<usize>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyList>,
    Bound<'py, PyAny>,
);

/// The first of `keys` on `attrs` that is neither None nor "", as `str()`.
fn first_named<'py>(
    attrs: &Bound<'py, PyDict>,
    keys: &[Bound<'py, PyString>],
) -> Res<Option<Bound<'py, PyAny>>> {
    for key in keys {
        if let Some(value) = get(attrs, key)? {
            if !is_empty_str(&value) {
                return Ok(Some(value.str()?.into_any()));
            }
        }
    }
    Ok(None)
}

pub fn partition_fields<'py>(
    spans: &Bound<'py, PyList>,
    task_key_attributes: &[Bound<'py, PyString>],
    want_session: bool,
    json_dumps: &Bound<'py, PyAny>,
) -> Res<Fields<'py>> {
    let py = spans.py();
    let items: Vec<Bound<'py, PyAny>> = spans.iter().collect();
    let views = items.iter().map(view).collect::<Res<Vec<_>>>()?;
    let resource_key = intern!(py, "resource_attributes");
    let resource_of = |i: usize| -> Res<Bound<'py, PyAny>> {
        Ok(items[i]
            .getattr(intern!(py, "__dict__"))?
            .get_item(resource_key)?)
    };
    let (order, task_key, session, trace_ids, annotation) = fields_of_views(
        py,
        &views,
        resource_of,
        task_key_attributes,
        want_session,
        json_dumps,
    )?;
    let ordered = PyList::new(py, order.iter().map(|&i| &items[i]))?;
    Ok((ordered, task_key, session, trace_ids, annotation))
}

/// `partition_fields` of spans read into views, with the span order as indices into `views`;
/// `resource_of(i)`: span i's resource attributes (read only when no span attribute names the
/// task key).
pub(crate) fn fields_of_views<'py>(
    py: Python<'py>,
    views: &[View<'py>],
    resource_of: impl Fn(usize) -> Res<Bound<'py, PyAny>>,
    task_key_attributes: &[Bound<'py, PyString>],
    want_session: bool,
    json_dumps: &Bound<'py, PyAny>,
) -> Res<Derived<'py>> {
    let mut order: Vec<usize> = (0..views.len()).collect();
    order.sort_by(|a, b| span_order(&views[*a], &views[*b]));
    let present: FnvSet<(&str, &str)> = views.iter().map(|v| (v.trace(), v.span())).collect();
    let roots: Vec<usize> = order
        .iter()
        .copied()
        .filter(|&i| match views[i].parent() {
            None => true,
            Some(parent) => !present.contains(&(views[i].trace(), parent)),
        })
        .collect();
    let none = || py.None().into_bound(py);
    let mut session = none();
    if want_session {
        let (primary, fallback) = (intern!(py, "session.id"), intern!(py, "gen_ai.conversation.id"));
        let (mut first, mut conversation): (Option<Bound<'py, PyAny>>, Option<Bound<'py, PyAny>>) =
            (None, None);
        for &i in &order {
            let attrs = &views[i].attrs;
            first = first_named(attrs, std::slice::from_ref(primary))?;
            if first.is_some() {
                break;
            }
            if conversation.is_none() {
                conversation = first_named(attrs, std::slice::from_ref(fallback))?;
            }
        }
        let found = first.or(conversation);
        session = found.unwrap_or_else(none);
    }
    let mut task_key: Option<Bound<'py, PyAny>> = None;
    'search: for candidates in [&roots, &order] {
        for &i in candidates.iter() {
            if let Some(value) = first_named(&views[i].attrs, task_key_attributes)? {
                task_key = Some(value);
                break 'search;
            }
        }
    }
    if task_key.is_none() {
        for &i in &order {
            let resource = resource_of(i)?
                .downcast_into::<PyDict>()
                .map_err(|_| Unhandled::Value)?;
            if let Some(value) = first_named(&resource, task_key_attributes)? {
                task_key = Some(value);
                break;
            }
        }
    }
    let task_key = match task_key {
        Some(value) => value,
        None => match roots.first().or(order.first()) {
            Some(&i) => views[i].name_py.clone().into_any(),
            None => none(),
        },
    };
    let mut seen: FnvSet<&str> = FnvSet::default();
    let trace_ids = PyList::empty(py);
    for &i in &order {
        if seen.insert(views[i].trace()) {
            trace_ids.append(&views[i].trace_py)?;
        }
    }
    let mut annotation = none();
    for &i in &roots {
        if let Some(value) = get(&views[i].attrs, intern!(py, "aip.eval.expected_steps"))? {
            annotation = if value.downcast::<PyString>().is_ok() {
                value
            } else {
                json_dumps.call1((value,))?
            };
            break;
        }
    }
    Ok((order, task_key, session, trace_ids, annotation))
}
