//! Which changes between two versions of a protobuf contract break a peer
//! that still speaks the older one.
//!
//! Protobuf stays readable across versions as long as a field keeps its
//! number, its type and its cardinality, an enum value keeps its number,
//! and a method keeps its request, response and streaming shape. Adding
//! fields, messages, enum values and methods is always safe: an old reader
//! skips unknown fields and keeps unknown enum numbers. Everything else is
//! listed here, one line per problem, so a failing test names each one.
//!
//! A field the new version drops is only safe when its number (or name) is
//! reserved, so no later field can reuse the number with another meaning.
//! Renaming a field or enum value keeps the binary encoding but breaks the
//! JSON mapping and every client regenerated from the new files, so it is
//! listed too.

use std::collections::BTreeMap;

use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{
    DescriptorProto, EnumDescriptorProto, FieldDescriptorProto, FileDescriptorSet,
    MethodDescriptorProto,
};

/// Every message, enum and method of a descriptor set, by full name
/// (`fencelock.v1.AcquireRequest`, `fencelock.v1.LockService.Acquire`).
#[derive(Default)]
struct Index<'a> {
    messages: BTreeMap<String, &'a DescriptorProto>,
    enums: BTreeMap<String, &'a EnumDescriptorProto>,
    methods: BTreeMap<String, &'a MethodDescriptorProto>,
}

impl<'a> Index<'a> {
    fn of(set: &'a FileDescriptorSet) -> Index<'a> {
        let mut index = Index::default();
        for file in &set.file {
            let package = file.package();
            for message in &file.message_type {
                index.add_message(package, message);
            }
            for e in &file.enum_type {
                index.enums.insert(qualified(package, e.name()), e);
            }
            for service in &file.service {
                let service_name = qualified(package, service.name());
                for method in &service.method {
                    index
                        .methods
                        .insert(format!("{service_name}.{}", method.name()), method);
                }
            }
        }
        index
    }

    fn add_message(&mut self, scope: &str, message: &'a DescriptorProto) {
        let name = qualified(scope, message.name());
        for nested in &message.nested_type {
            self.add_message(&name, nested);
        }
        for e in &message.enum_type {
            self.enums.insert(qualified(&name, e.name()), e);
        }
        self.messages.insert(name, message);
    }
}

fn qualified(scope: &str, name: &str) -> String {
    if scope.is_empty() {
        name.to_string()
    } else {
        format!("{scope}.{name}")
    }
}

/// Every change from `old` to `new` that breaks a peer speaking `old`, as
/// one readable line each; empty when `new` is compatible.
pub fn breaking_changes(old: &FileDescriptorSet, new: &FileDescriptorSet) -> Vec<String> {
    let (old, new) = (Index::of(old), Index::of(new));
    let mut problems = Vec::new();
    for (name, old_message) in &old.messages {
        match new.messages.get(name) {
            None => problems.push(format!("message {name} was removed")),
            Some(new_message) => compare_message(name, old_message, new_message, &mut problems),
        }
    }
    for (name, old_enum) in &old.enums {
        match new.enums.get(name) {
            None => problems.push(format!("enum {name} was removed")),
            Some(new_enum) => compare_enum(name, old_enum, new_enum, &mut problems),
        }
    }
    for (name, old_method) in &old.methods {
        match new.methods.get(name) {
            None => problems.push(format!("method {name} was removed")),
            Some(new_method) => compare_method(name, old_method, new_method, &mut problems),
        }
    }
    problems
}

fn compare_message(
    name: &str,
    old: &DescriptorProto,
    new: &DescriptorProto,
    problems: &mut Vec<String>,
) {
    for old_field in &old.field {
        let number = old_field.number();
        let Some(new_field) = new.field.iter().find(|f| f.number() == number) else {
            let reserved_number = new
                .reserved_range
                .iter()
                .any(|r| r.start() <= number && number < r.end());
            let reserved_name = new.reserved_name.iter().any(|n| n == old_field.name());
            if !(reserved_number && reserved_name) {
                problems.push(format!(
                    "{name}.{} (field {number}) was removed without reserving its number and name",
                    old_field.name()
                ));
            }
            continue;
        };
        let field = format!("{name}.{} (field {number})", old_field.name());
        if new_field.name() != old_field.name() {
            problems.push(format!("{field} was renamed to {}", new_field.name()));
        }
        if !same_type(old_field, new_field) {
            problems.push(format!(
                "{field} changed type from {} to {}",
                type_name(old_field),
                type_name(new_field)
            ));
        }
        let repeated = |f: &FieldDescriptorProto| f.label() == Label::Repeated;
        if repeated(old_field) != repeated(new_field) {
            problems.push(format!("{field} changed between singular and repeated"));
        }
        if old_field.oneof_index.is_some() != new_field.oneof_index.is_some() {
            problems.push(format!("{field} moved into or out of a oneof"));
        }
    }
}

fn same_type(old: &FieldDescriptorProto, new: &FieldDescriptorProto) -> bool {
    old.r#type() == new.r#type()
        && match old.r#type() {
            Type::Message | Type::Enum | Type::Group => old.type_name() == new.type_name(),
            _ => true,
        }
}

fn type_name(field: &FieldDescriptorProto) -> String {
    match field.r#type() {
        Type::Message | Type::Enum | Type::Group => {
            field.type_name().trim_start_matches('.').into()
        }
        other => other
            .as_str_name()
            .trim_start_matches("TYPE_")
            .to_lowercase(),
    }
}

fn compare_enum(
    name: &str,
    old: &EnumDescriptorProto,
    new: &EnumDescriptorProto,
    problems: &mut Vec<String>,
) {
    for old_value in &old.value {
        match new.value.iter().find(|v| v.name() == old_value.name()) {
            None => {
                if !new.value.iter().any(|v| v.number() == old_value.number()) {
                    problems.push(format!(
                        "{name}.{} (= {}) was removed",
                        old_value.name(),
                        old_value.number()
                    ));
                } else {
                    problems.push(format!(
                        "{name}.{} (= {}) was renamed",
                        old_value.name(),
                        old_value.number()
                    ));
                }
            }
            Some(new_value) if new_value.number() != old_value.number() => problems.push(format!(
                "{name}.{} changed number from {} to {}",
                old_value.name(),
                old_value.number(),
                new_value.number()
            )),
            Some(_) => {}
        }
    }
}

fn compare_method(
    name: &str,
    old: &MethodDescriptorProto,
    new: &MethodDescriptorProto,
    problems: &mut Vec<String>,
) {
    if old.input_type() != new.input_type() {
        problems.push(format!(
            "method {name} takes {} instead of {}",
            new.input_type().trim_start_matches('.'),
            old.input_type().trim_start_matches('.')
        ));
    }
    if old.output_type() != new.output_type() {
        problems.push(format!(
            "method {name} returns {} instead of {}",
            new.output_type().trim_start_matches('.'),
            old.output_type().trim_start_matches('.')
        ));
    }
    if old.client_streaming() != new.client_streaming()
        || old.server_streaming() != new.server_streaming()
    {
        problems.push(format!("method {name} changed its streaming"));
    }
}
