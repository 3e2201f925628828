//! Checks of the public contract itself, read from the compiled descriptors:
//! everything is documented, and the reason table in `errors.proto` says the
//! same as the code (`status::code_for`, `status::default_retry`).

use std::collections::HashMap;

use fencelock_api::status::{code_for, default_retry, ERROR_DETAIL_TYPE_URL};
use fencelock_api::v1::Reason;
use fencelock_api::FILE_DESCRIPTOR_SET;
use prost::Message;
use prost_types::{DescriptorProto, FileDescriptorProto, FileDescriptorSet};

// Field numbers in descriptor.proto, which make up source-info paths.
const FILE_MESSAGE_TYPE: i32 = 4;
const FILE_ENUM_TYPE: i32 = 5;
const FILE_SERVICE: i32 = 6;
const MESSAGE_FIELD: i32 = 2;
const MESSAGE_NESTED_TYPE: i32 = 3;
const MESSAGE_ENUM_TYPE: i32 = 4;
const MESSAGE_ONEOF_DECL: i32 = 8;
const ENUM_VALUE: i32 = 2;
const SERVICE_METHOD: i32 = 2;

fn descriptor_set() -> FileDescriptorSet {
    FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).expect("FILE_DESCRIPTOR_SET decodes")
}

fn our_files(set: &FileDescriptorSet) -> Vec<&FileDescriptorProto> {
    let files: Vec<_> = set
        .file
        .iter()
        .filter(|f| f.package() == "fencelock.v1")
        .collect();
    assert!(
        !files.is_empty(),
        "no fencelock.v1 files in the descriptor set"
    );
    files
}

/// Leading comments of one file, by source-info path.
fn comments(file: &FileDescriptorProto) -> HashMap<Vec<i32>, String> {
    let info = file
        .source_code_info
        .as_ref()
        .expect("descriptors are compiled with source info");
    info.location
        .iter()
        .filter_map(|loc| {
            let text = loc.leading_comments.as_deref()?.trim();
            (!text.is_empty()).then(|| (loc.path.clone(), text.to_owned()))
        })
        .collect()
}

/// Every documentable element of a message: (path, human-readable name).
fn message_elements(
    message: &DescriptorProto,
    path: Vec<i32>,
    name: String,
    out: &mut Vec<(Vec<i32>, String)>,
) {
    let child = |kind: i32, index: usize| {
        let mut p = path.clone();
        p.extend([kind, index as i32]);
        p
    };
    for (i, field) in message.field.iter().enumerate() {
        out.push((child(MESSAGE_FIELD, i), format!("{name}.{}", field.name())));
    }
    for (i, oneof) in message.oneof_decl.iter().enumerate() {
        out.push((
            child(MESSAGE_ONEOF_DECL, i),
            format!("{name}.{} (oneof)", oneof.name()),
        ));
    }
    for (i, nested) in message.enum_type.iter().enumerate() {
        let nested_name = format!("{name}.{}", nested.name());
        out.push((child(MESSAGE_ENUM_TYPE, i), nested_name.clone()));
        for (j, value) in nested.value.iter().enumerate() {
            let mut p = child(MESSAGE_ENUM_TYPE, i);
            p.extend([ENUM_VALUE, j as i32]);
            out.push((p, format!("{nested_name}.{}", value.name())));
        }
    }
    for (i, nested) in message.nested_type.iter().enumerate() {
        let nested_name = format!("{name}.{}", nested.name());
        out.push((child(MESSAGE_NESTED_TYPE, i), nested_name.clone()));
        message_elements(nested, child(MESSAGE_NESTED_TYPE, i), nested_name, out);
    }
}

/// Every documentable element of a file: messages, fields, oneofs, enums,
/// enum values, services and rpcs.
fn file_elements(file: &FileDescriptorProto) -> Vec<(Vec<i32>, String)> {
    let mut out = Vec::new();
    for (i, message) in file.message_type.iter().enumerate() {
        let path = vec![FILE_MESSAGE_TYPE, i as i32];
        out.push((path.clone(), message.name().to_owned()));
        message_elements(message, path, message.name().to_owned(), &mut out);
    }
    for (i, e) in file.enum_type.iter().enumerate() {
        out.push((vec![FILE_ENUM_TYPE, i as i32], e.name().to_owned()));
        for (j, value) in e.value.iter().enumerate() {
            out.push((
                vec![FILE_ENUM_TYPE, i as i32, ENUM_VALUE, j as i32],
                format!("{}.{}", e.name(), value.name()),
            ));
        }
    }
    for (i, service) in file.service.iter().enumerate() {
        out.push((vec![FILE_SERVICE, i as i32], service.name().to_owned()));
        for (j, method) in service.method.iter().enumerate() {
            out.push((
                vec![FILE_SERVICE, i as i32, SERVICE_METHOD, j as i32],
                format!("{}.{}", service.name(), method.name()),
            ));
        }
    }
    out
}

#[test]
fn every_element_of_the_contract_is_documented() {
    let set = descriptor_set();
    let mut undocumented = Vec::new();
    for file in our_files(&set) {
        let comments = comments(file);
        for (path, name) in file_elements(file) {
            if !comments.contains_key(&path) {
                undocumented.push(format!("{}: {name}", file.name()));
            }
        }
    }
    assert!(
        undocumented.is_empty(),
        "proto elements without a leading comment:\n{}",
        undocumented.join("\n")
    );
}

/// `InvalidArgument` -> `INVALID_ARGUMENT`: the canonical gRPC code name.
fn canonical_code_name(code: tonic::Code) -> String {
    let mut name = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

/// The first word after `label` in `text`, without trailing punctuation.
fn word_after<'a>(text: &'a str, label: &str) -> Option<&'a str> {
    let rest = &text[text.find(label)? + label.len()..];
    rest.split_whitespace()
        .next()
        .map(|w| w.trim_end_matches(|c: char| !c.is_ascii_alphabetic()))
}

#[test]
fn reason_docs_state_the_code_and_retry_the_code_uses() {
    let set = descriptor_set();
    let mut checked = 0;
    for file in our_files(&set) {
        let comments = comments(file);
        let Some((index, reasons)) = file
            .enum_type
            .iter()
            .enumerate()
            .find(|(_, e)| e.name() == "Reason")
        else {
            continue;
        };
        for (j, value) in reasons.value.iter().enumerate() {
            let reason = Reason::try_from(value.number())
                .unwrap_or_else(|_| panic!("{} is not in the generated enum", value.name()));
            assert_eq!(reason.as_str_name(), value.name());

            let path = vec![FILE_ENUM_TYPE, index as i32, ENUM_VALUE, j as i32];
            let doc = comments
                .get(&path)
                .unwrap_or_else(|| panic!("{} is undocumented", value.name()));
            let expected_code = canonical_code_name(code_for(reason));
            assert_eq!(
                word_after(doc, "gRPC code:"),
                Some(expected_code.as_str()),
                "{}: the comment's `gRPC code:` disagrees with code_for",
                value.name()
            );
            let retry = default_retry(reason).as_str_name();
            let expected_retry = retry.strip_prefix("RETRY_POLICY_").unwrap_or(retry);
            assert_eq!(
                word_after(doc, "Retry:"),
                Some(expected_retry),
                "{}: the comment's `Retry:` disagrees with default_retry",
                value.name()
            );
            checked += 1;
        }
    }
    assert!(checked > 30, "expected the Reason enum, checked {checked}");
}

#[test]
fn error_detail_type_url_names_the_message() {
    let set = descriptor_set();
    let declared = our_files(&set)
        .iter()
        .any(|f| f.message_type.iter().any(|m| m.name() == "ErrorDetail"));
    assert!(declared);
    assert_eq!(
        ERROR_DETAIL_TYPE_URL.rsplit('/').next(),
        Some("fencelock.v1.ErrorDetail")
    );
}

#[test]
fn descriptor_set_has_both_services_for_reflection() {
    let set = descriptor_set();
    let services: Vec<&str> = our_files(&set)
        .iter()
        .flat_map(|f| f.service.iter().map(|s| s.name()))
        .collect();
    assert!(services.contains(&"LockService"), "{services:?}");
    assert!(services.contains(&"AdminService"), "{services:?}");
    // Reflection needs every import of a file in the same set.
    let names: Vec<&str> = set.file.iter().map(|f| f.name()).collect();
    for file in &set.file {
        for dep in &file.dependency {
            assert!(names.contains(&dep.as_str()), "{dep} missing from the set");
        }
    }
}

#[test]
fn service_names_are_stable() {
    // The names in the HTTP/2 paths clients call: renaming the package, a
    // service or an rpc breaks every deployed client.
    use fencelock_api::v1::{admin_service_server, lock_service_server};
    assert_eq!(
        lock_service_server::SERVICE_NAME,
        "fencelock.v1.LockService"
    );
    assert_eq!(
        admin_service_server::SERVICE_NAME,
        "fencelock.v1.AdminService"
    );
}
