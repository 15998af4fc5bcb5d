//! The structural check at load: a component's `policy` export compared
//! with its interface line's WIT, function by function and type by type, so
//! that a component of the right version but a different shape (a field
//! added, removed, renamed or retyped) is refused when it is loaded, with a
//! message naming the function, the type and the field, instead of failing
//! at its first call.
//!
//! The expected side is the line's WIT itself (the text bindgen reads),
//! parsed once per process; the found side is the compiled component's
//! type as wasmtime reports it.

use std::sync::OnceLock;

use wasmtime::Engine;
use wasmtime::component::Component;
use wasmtime::component::types::{ComponentItem, Type};
use wit_parser::{InterfaceId, Resolve, Type as Wit, TypeDefKind};

use crate::versions::{Interface, PACKAGE};

/// One line's WIT, resolved.
struct Expected {
    resolve: Resolve,
    policy: InterfaceId,
}

/// The resolved WIT of `interface` (parsed on first use).
fn expected(interface: Interface) -> Result<&'static Expected, String> {
    static LINES: OnceLock<Vec<Result<Expected, String>>> = OnceLock::new();
    let lines = LINES.get_or_init(|| Interface::ALL.iter().map(|i| parse(*i)).collect());
    let position = Interface::ALL
        .iter()
        .position(|i| *i == interface)
        .unwrap_or_default();
    lines[position].as_ref().map_err(Clone::clone)
}

fn parse(interface: Interface) -> Result<Expected, String> {
    let mut resolve = Resolve::default();
    let package = resolve
        .push_source(
            &format!("wit/{}/policy.wit", interface.line()),
            interface.wit(),
        )
        .map_err(|e| format!("the host's own WIT of {interface} does not parse: {e:#}"))?;
    let policy = resolve.packages[package]
        .interfaces
        .get("policy")
        .copied()
        .ok_or_else(|| format!("the host's own WIT of {interface} has no `policy` interface"))?;
    Ok(Expected { resolve, policy })
}

/// Compare the component's `nyann:policy/policy@<line>` export with the
/// line's WIT; the error says where they differ.
pub(crate) fn check(
    engine: &Engine,
    component: &Component,
    interface: Interface,
) -> Result<(), String> {
    let expected = expected(interface)?;
    let ty = component.component_type();
    let prefix = format!("{PACKAGE}/policy@");
    let export = ty
        .exports(engine)
        .map(|(name, _)| name)
        .find(|name| name.starts_with(&prefix) && Interface::of_name(name) == Some(interface))
        .ok_or_else(|| format!("does not export {prefix}{}.x", interface.line()))?;
    let Some(ComponentItem::ComponentInstance(instance)) =
        ty.get_export(engine, export).map(|e| e.ty)
    else {
        return Err(format!(
            "exports `{export}`, but not as an interface instance"
        ));
    };
    let resolve = &expected.resolve;
    for (name, function) in &resolve.interfaces[expected.policy].functions {
        let mismatch = |what: String| format!("its `{name}` does not match {interface}: {what}");
        let Some(ComponentItem::ComponentFunc(found)) =
            instance.get_export(engine, name).map(|e| e.ty)
        else {
            return Err(format!(
                "its `{export}` has no function `{name}`, which {interface} requires"
            ));
        };
        let params: Vec<(&str, Type)> = found.params().collect();
        if params.len() != function.params.len() {
            let want: Vec<&str> = function.params.iter().map(|p| p.name.as_str()).collect();
            let got: Vec<&str> = params.iter().map(|(n, _)| *n).collect();
            return Err(mismatch(format!(
                "expected parameters ({}), found ({})",
                want.join(", "),
                got.join(", ")
            )));
        }
        for (want, (got_name, got)) in function.params.iter().zip(&params) {
            if want.name != *got_name {
                return Err(mismatch(format!(
                    "expected parameter `{}`, found `{got_name}`",
                    want.name
                )));
            }
            compare(resolve, &want.ty, got)
                .map_err(|e| mismatch(format!("parameter `{}` → {e}", want.name)))?;
        }
        let results: Vec<Type> = found.results().collect();
        match (&function.result, results.as_slice()) {
            (None, []) => {}
            (Some(want), [got]) => {
                compare(resolve, want, got).map_err(|e| mismatch(format!("result → {e}")))?
            }
            (want, got) => {
                return Err(mismatch(format!(
                    "expected {} result(s), found {}",
                    usize::from(want.is_some()),
                    got.len()
                )));
            }
        }
    }
    Ok(())
}

/// Compare one expected WIT type with a found component type.
fn compare(resolve: &Resolve, want: &Wit, got: &Type) -> Result<(), String> {
    let id = match want {
        Wit::Id(id) => *id,
        primitive => {
            return if primitive_matches(primitive, got) {
                Ok(())
            } else {
                Err(format!(
                    "expected {}, found {}",
                    wit_name(primitive),
                    found(got)
                ))
            };
        }
    };
    let def = &resolve.types[id];
    let named = |kind: &str| match &def.name {
        Some(name) => format!("{kind} `{name}`"),
        None => kind.to_string(),
    };
    let wrong = |kind: &str| Err(format!("expected {}, found {}", named(kind), found(got)));
    match (&def.kind, got) {
        (TypeDefKind::Type(alias), _) => compare(resolve, alias, got),
        (TypeDefKind::Record(record), Type::Record(g)) => {
            let want: Vec<&str> = record.fields.iter().map(|f| f.name.as_str()).collect();
            let fields: Vec<_> = g.fields().collect();
            let have: Vec<&str> = fields.iter().map(|f| f.name).collect();
            if want != have {
                return Err(format!(
                    "{}: expected {} fields ({}), found {} ({})",
                    named("record"),
                    want.len(),
                    want.join(", "),
                    have.len(),
                    have.join(", ")
                ));
            }
            for (field, got) in record.fields.iter().zip(&fields) {
                compare(resolve, &field.ty, &got.ty)
                    .map_err(|e| format!("{} field `{}` → {e}", named("record"), field.name))?;
            }
            Ok(())
        }
        (TypeDefKind::Variant(variant), Type::Variant(g)) => {
            let cases: Vec<_> = g.cases().collect();
            same_names(
                &named("variant"),
                variant.cases.iter().map(|c| c.name.as_str()),
                cases.iter().map(|c| c.name),
            )?;
            for (case, got) in variant.cases.iter().zip(&cases) {
                let context =
                    |e: String| format!("{} case `{}` → {e}", named("variant"), case.name);
                match (&case.ty, &got.ty) {
                    (None, None) => {}
                    (Some(want), Some(got)) => compare(resolve, want, got).map_err(context)?,
                    _ => return Err(context("payloads differ".to_string())),
                }
            }
            Ok(())
        }
        (TypeDefKind::Enum(e), Type::Enum(g)) => same_names(
            &named("enum"),
            e.cases.iter().map(|c| c.name.as_str()),
            g.names(),
        ),
        (TypeDefKind::Flags(f), Type::Flags(g)) => same_names(
            &named("flags"),
            f.flags.iter().map(|c| c.name.as_str()),
            g.names(),
        ),
        (TypeDefKind::List(element), Type::List(g)) => compare(resolve, element, &g.ty())
            .map_err(|e| format!("{} element → {e}", named("list"))),
        (TypeDefKind::Option(inner), Type::Option(g)) => {
            compare(resolve, inner, &g.ty()).map_err(|e| format!("{} → {e}", named("option")))
        }
        (TypeDefKind::Tuple(tuple), Type::Tuple(g)) => {
            let types: Vec<Type> = g.types().collect();
            if types.len() != tuple.types.len() {
                return wrong("tuple");
            }
            for (i, (want, got)) in tuple.types.iter().zip(&types).enumerate() {
                compare(resolve, want, got).map_err(|e| format!("tuple item {i} → {e}"))?;
            }
            Ok(())
        }
        (TypeDefKind::Result(result), Type::Result(g)) => {
            for (side, want, got) in [("ok", &result.ok, g.ok()), ("err", &result.err, g.err())] {
                match (want, got) {
                    (None, None) => {}
                    (Some(want), Some(got)) => compare(resolve, want, &got)
                        .map_err(|e| format!("{} {side} → {e}", named("result")))?,
                    _ => return wrong("result"),
                }
            }
            Ok(())
        }
        (TypeDefKind::Record(_), _) => wrong("record"),
        (TypeDefKind::Variant(_), _) => wrong("variant"),
        (TypeDefKind::Enum(_), _) => wrong("enum"),
        (TypeDefKind::Flags(_), _) => wrong("flags"),
        (TypeDefKind::List(_), _) => wrong("list"),
        (TypeDefKind::Option(_), _) => wrong("option"),
        (TypeDefKind::Tuple(_), _) => wrong("tuple"),
        (TypeDefKind::Result(_), _) => wrong("result"),
        // Resources, handles, maps, futures and streams: the policy WIT
        // uses none of them.
        _ => wrong("type"),
    }
}

/// The cases of a variant or enum, or the flags, in the same order.
fn same_names<'a>(
    what: &str,
    want: impl Iterator<Item = &'a str>,
    have: impl Iterator<Item = &'a str>,
) -> Result<(), String> {
    let (want, have): (Vec<&str>, Vec<&str>) = (want.collect(), have.collect());
    if want == have {
        Ok(())
    } else {
        Err(format!(
            "{what}: expected cases ({}), found ({})",
            want.join(", "),
            have.join(", ")
        ))
    }
}

fn primitive_matches(want: &Wit, got: &Type) -> bool {
    matches!(
        (want, got),
        (Wit::Bool, Type::Bool)
            | (Wit::U8, Type::U8)
            | (Wit::U16, Type::U16)
            | (Wit::U32, Type::U32)
            | (Wit::U64, Type::U64)
            | (Wit::S8, Type::S8)
            | (Wit::S16, Type::S16)
            | (Wit::S32, Type::S32)
            | (Wit::S64, Type::S64)
            | (Wit::F32, Type::Float32)
            | (Wit::F64, Type::Float64)
            | (Wit::Char, Type::Char)
            | (Wit::String, Type::String)
            | (Wit::ErrorContext, Type::ErrorContext)
    )
}

fn wit_name(primitive: &Wit) -> &'static str {
    match primitive {
        Wit::Bool => "bool",
        Wit::U8 => "u8",
        Wit::U16 => "u16",
        Wit::U32 => "u32",
        Wit::U64 => "u64",
        Wit::S8 => "s8",
        Wit::S16 => "s16",
        Wit::S32 => "s32",
        Wit::S64 => "s64",
        Wit::F32 => "f32",
        Wit::F64 => "f64",
        Wit::Char => "char",
        Wit::String => "string",
        Wit::ErrorContext => "error-context",
        Wit::Id(_) => "a named type",
    }
}

/// A short description of a found type, for messages.
fn found(got: &Type) -> String {
    match got {
        Type::Bool => "bool".into(),
        Type::U8 => "u8".into(),
        Type::U16 => "u16".into(),
        Type::U32 => "u32".into(),
        Type::U64 => "u64".into(),
        Type::S8 => "s8".into(),
        Type::S16 => "s16".into(),
        Type::S32 => "s32".into(),
        Type::S64 => "s64".into(),
        Type::Float32 => "f32".into(),
        Type::Float64 => "f64".into(),
        Type::Char => "char".into(),
        Type::String => "string".into(),
        Type::Record(r) => format!("a record of {} fields", r.fields().len()),
        Type::Variant(v) => format!("a variant of {} cases", v.cases().len()),
        Type::Enum(e) => format!("an enum of {} cases", e.names().len()),
        Type::Flags(_) => "flags".into(),
        Type::List(_) => "a list".into(),
        Type::Option(_) => "an option".into(),
        Type::Result(_) => "a result".into(),
        Type::Tuple(t) => format!("a tuple of {}", t.types().len()),
        other => format!("{other:?}")
            .split('(')
            .next()
            .unwrap_or("another type")
            .to_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_parses() {
        for interface in Interface::ALL {
            let expected = expected(interface).unwrap_or_else(|e| panic!("{e}"));
            let functions: Vec<&String> = expected.resolve.interfaces[expected.policy]
                .functions
                .keys()
                .collect();
            assert_eq!(functions, ["describe", "validate", "judge"], "{interface}");
        }
    }
}
