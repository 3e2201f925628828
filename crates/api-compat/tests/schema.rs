//! The current contract against the previous release's, field by field:
//! nothing an old client sends or decodes may change meaning.

use std::path::Path;
use std::process::Command;

use fencelock_api_compat::schema::breaking_changes;
use fencelock_api_compat::{PREVIOUS_DESCRIPTOR_SET, PREVIOUS_RELEASE};
use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};

fn previous() -> FileDescriptorSet {
    FileDescriptorSet::decode(PREVIOUS_DESCRIPTOR_SET).expect("frozen descriptor set decodes")
}

fn current() -> FileDescriptorSet {
    FileDescriptorSet::decode(fencelock_api::FILE_DESCRIPTOR_SET)
        .expect("current descriptor set decodes")
}

fn message<'a>(set: &'a mut FileDescriptorSet, name: &str) -> &'a mut DescriptorProto {
    set.file
        .iter_mut()
        .flat_map(|f| f.message_type.iter_mut())
        .find(|m| m.name() == name)
        .unwrap_or_else(|| panic!("no message {name}"))
}

/// Asserts that `mutate`, applied to the current contract, is reported by
/// a line containing `expected`.
fn assert_caught(mutate: impl FnOnce(&mut FileDescriptorSet), expected: &str) {
    let mut broken = current();
    mutate(&mut broken);
    let problems = breaking_changes(&previous(), &broken);
    assert!(
        problems.iter().any(|p| p.contains(expected)),
        "expected a problem containing {expected:?}, got {problems:#?}"
    );
}

#[test]
fn the_current_contract_breaks_nothing_the_previous_release_relied_on() {
    let problems = breaking_changes(&previous(), &current());
    assert!(
        problems.is_empty(),
        "the contract changed incompatibly since {PREVIOUS_RELEASE}:\n{}",
        problems.join("\n")
    );
    // The comparison is not vacuous: the frozen contract has the services.
    let old = previous();
    let services: Vec<&str> = old
        .file
        .iter()
        .flat_map(|f| f.service.iter().map(|s| s.name()))
        .collect();
    assert!(services.contains(&"LockService"), "{services:?}");
    assert!(services.contains(&"AdminService"), "{services:?}");
}

#[test]
fn a_renumbered_field_is_caught() {
    assert_caught(
        |set| {
            let m = message(set, "AcquireRequest");
            let f = m.field.iter_mut().find(|f| f.name() == "resource").unwrap();
            f.number = Some(900);
        },
        "AcquireRequest.resource (field 1) was removed",
    );
}

#[test]
fn a_retyped_field_is_caught() {
    assert_caught(
        |set| {
            let m = message(set, "AcquireResponse");
            let f = m
                .field
                .iter_mut()
                .find(|f| f.name() == "fencing_token")
                .unwrap();
            f.set_type(Type::Uint64);
        },
        "AcquireResponse.fencing_token (field",
    );
}

#[test]
fn a_field_made_repeated_is_caught() {
    assert_caught(
        |set| {
            let m = message(set, "GetResponse");
            let f = m.field.iter_mut().find(|f| f.name() == "held").unwrap();
            f.set_label(Label::Repeated);
        },
        "GetResponse.held (field",
    );
}

#[test]
fn a_dropped_field_is_caught_unless_reserved() {
    let drop_lease_id = |set: &mut FileDescriptorSet| {
        let m = message(set, "ReleaseRequest");
        m.field.retain(|f| f.name() != "lease_id");
    };
    assert_caught(drop_lease_id, "ReleaseRequest.lease_id");

    // Reserved by number and name, the same drop is safe.
    let mut reserved = current();
    let m = message(&mut reserved, "ReleaseRequest");
    let number = m
        .field
        .iter()
        .find(|f| f.name() == "lease_id")
        .unwrap()
        .number();
    drop_lease_id(&mut reserved);
    let m = message(&mut reserved, "ReleaseRequest");
    m.reserved_range
        .push(prost_types::descriptor_proto::ReservedRange {
            start: Some(number),
            end: Some(number + 1),
        });
    m.reserved_name.push("lease_id".into());
    assert_eq!(
        breaking_changes(&previous(), &reserved),
        Vec::<String>::new()
    );
}

#[test]
fn a_renumbered_enum_value_is_caught() {
    assert_caught(
        |set| {
            let e = set
                .file
                .iter_mut()
                .flat_map(|f| f.enum_type.iter_mut())
                .find(|e| e.name() == "Reason")
                .unwrap();
            let v = e
                .value
                .iter_mut()
                .find(|v| v.name() == "REASON_LOCK_HELD")
                .unwrap();
            v.number = Some(v.number() + 1000);
        },
        "Reason.REASON_LOCK_HELD changed number",
    );
}

#[test]
fn a_removed_or_reshaped_method_is_caught() {
    assert_caught(
        |set| {
            for file in &mut set.file {
                for service in &mut file.service {
                    service.method.retain(|m| m.name() != "Renew");
                }
            }
        },
        "method fencelock.v1.LockService.Renew was removed",
    );
    assert_caught(
        |set| {
            for file in &mut set.file {
                for service in &mut file.service {
                    for method in &mut service.method {
                        if method.name() == "Get" {
                            method.server_streaming = Some(true);
                        }
                    }
                }
            }
        },
        "method fencelock.v1.LockService.Get changed its streaming",
    );
}

/// The frozen release is the one `make upgrade-test` upgrades from, so the
/// data-format and wire-format compatibility claims name one release.
#[test]
fn the_frozen_release_is_the_makefiles_previous_release() {
    let makefile = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Makefile");
    let text = std::fs::read_to_string(&makefile).expect("read the Makefile");
    let line = text
        .lines()
        .find(|l| l.starts_with("PREVIOUS_RELEASE"))
        .expect("the Makefile names PREVIOUS_RELEASE");
    let value = line.split('=').nth(1).map(str::trim).unwrap_or_default();
    assert_eq!(
        value, PREVIOUS_RELEASE,
        "freeze proto/fencelock/v1 of the new PREVIOUS_RELEASE in crates/api-compat/proto/"
    );
}

/// The frozen files are that release's files, byte for byte, wherever the
/// repository's history is at hand (a source tarball has none: then this
/// says so and checks nothing).
#[test]
fn the_frozen_protos_are_the_previous_releases_own() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = root
        .join("proto")
        .join(PREVIOUS_RELEASE)
        .join("fencelock/v1");
    let has_history = Command::new("git")
        .args(["cat-file", "-e", &format!("{PREVIOUS_RELEASE}^{{commit}}")])
        .current_dir(root)
        .status()
        .is_ok_and(|s| s.success());
    if !has_history {
        eprintln!("no git history with {PREVIOUS_RELEASE} here: frozen files not compared");
        return;
    }
    let mut compared = 0;
    for entry in std::fs::read_dir(&dir).expect("frozen dir") {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let output = Command::new("git")
            .args([
                "show",
                &format!("{PREVIOUS_RELEASE}:proto/fencelock/v1/{name}"),
            ])
            .current_dir(root)
            .output()
            .expect("git show");
        assert!(
            output.status.success(),
            "{name} is not in {PREVIOUS_RELEASE}"
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            output.stdout,
            "{name} differs from {PREVIOUS_RELEASE}'s"
        );
        compared += 1;
    }
    assert_eq!(compared, 3, "lock, admin and errors protos are frozen");
}
