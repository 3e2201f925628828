//! Resource names: bounded, normalized, tenant-prefixed.
//!
//! A resource name is `tenant/path`. The tenant is the unit of quotas (waiter
//! caps now, more later), so it must be unambiguous: lower-case letters,
//! digits and `-`, starting with a letter or digit. The path is a business
//! name made of `A-Z a-z 0-9 . _ - : /` whose `/`-separated segments are not
//! empty. Names are validated, never rewritten: a name that is not already in
//! normal form is refused, so two spellings can never name two locks on one
//! thing.

use crate::cow_map::Spread;
use crate::limits::{MAX_RESOURCE_NAME_LEN, MAX_TENANT_LEN};

/// Why a resource name was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NameError {
    Empty,
    TooLong {
        len: usize,
        max: usize,
    },
    MissingTenant,
    TenantTooLong {
        len: usize,
        max: usize,
    },
    /// The byte at `pos` is not allowed there.
    InvalidChar {
        pos: usize,
        byte: u8,
    },
    /// A `/`-separated segment of the path is empty (leading, trailing or
    /// doubled `/`).
    EmptySegment {
        pos: usize,
    },
    /// A path segment is `.` or `..` (refused for new locks only; see
    /// [`ResourceName::check_new`]).
    DotSegment {
        pos: usize,
    },
}

impl std::fmt::Display for NameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NameError::Empty => write!(f, "name is empty"),
            NameError::TooLong { len, max } => write!(f, "name is {len} bytes, maximum is {max}"),
            NameError::MissingTenant => write!(f, "name must be `tenant/path`"),
            NameError::TenantTooLong { len, max } => {
                write!(f, "tenant is {len} bytes, maximum is {max}")
            }
            NameError::InvalidChar { pos, byte } => write!(
                f,
                "byte {pos} ({}) is not allowed; tenant allows [a-z0-9-], path allows [A-Za-z0-9._:/-]",
                char::from(*byte).escape_default()
            ),
            NameError::EmptySegment { pos } => write!(f, "empty path segment at byte {pos}"),
            NameError::DotSegment { pos } => write!(
                f,
                "path segment at byte {pos} is `.` or `..`; a system that normalises paths \
                 would see another name for the same thing"
            ),
        }
    }
}

impl std::error::Error for NameError {}

/// A validated resource name. Cheap to clone (it is small by construction).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceName(String);

impl ResourceName {
    /// Validates `name` and returns it as a resource name.
    pub fn parse(name: &str) -> Result<ResourceName, NameError> {
        validate(name)?;
        Ok(ResourceName(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The rules a name must also meet to start a new lock, on top of
    /// [`Self::parse`]: no `.` or `..` path segment (a protected system
    /// that normalises paths would see `a/x/../y` and `a/y` as one thing,
    /// while they are two locks here). Checked where acquires enter the
    /// service, not in `parse`: names already in logs, snapshots and
    /// exports (from before the rule) must still load, and their holders
    /// can still renew and release them.
    pub fn check_new(&self) -> Result<(), NameError> {
        let path_start = self.tenant().len() + 1;
        let mut pos = path_start;
        for segment in self.0[path_start..].split('/') {
            if segment == "." || segment == ".." {
                return Err(NameError::DotSegment { pos });
            }
            pos += segment.len() + 1;
        }
        Ok(())
    }

    /// The tenant prefix (before the first `/`).
    pub fn tenant(&self) -> &str {
        let slash = self.0.find('/');
        debug_assert!(slash.is_some(), "validated names always have a tenant");
        &self.0[..slash.unwrap_or(0)]
    }
}

impl std::fmt::Display for ResourceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn is_tenant_byte(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'
}

fn is_path_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':' | b'/')
}

fn validate(name: &str) -> Result<(), NameError> {
    let bytes = name.as_bytes();
    if bytes.is_empty() {
        return Err(NameError::Empty);
    }
    if bytes.len() > MAX_RESOURCE_NAME_LEN {
        return Err(NameError::TooLong {
            len: bytes.len(),
            max: MAX_RESOURCE_NAME_LEN,
        });
    }
    let Some(slash) = bytes.iter().position(|&b| b == b'/') else {
        return Err(NameError::MissingTenant);
    };
    if slash == 0 {
        return Err(NameError::MissingTenant);
    }
    if slash > MAX_TENANT_LEN {
        return Err(NameError::TenantTooLong {
            len: slash,
            max: MAX_TENANT_LEN,
        });
    }
    for (pos, &byte) in bytes[..slash].iter().enumerate() {
        if !is_tenant_byte(byte) || (pos == 0 && byte == b'-') {
            return Err(NameError::InvalidChar { pos, byte });
        }
    }
    // Path: after the tenant's slash; non-empty segments only.
    let mut segment_start = slash + 1;
    for (pos, &byte) in bytes.iter().enumerate().skip(slash + 1) {
        if !is_path_byte(byte) {
            return Err(NameError::InvalidChar { pos, byte });
        }
        if byte == b'/' {
            if pos == segment_start {
                return Err(NameError::EmptySegment { pos });
            }
            segment_start = pos + 1;
        }
    }
    if segment_start == bytes.len() {
        return Err(NameError::EmptySegment { pos: bytes.len() });
    }
    Ok(())
}

impl Spread for ResourceName {
    fn spread(&self) -> u64 {
        crate::slots::fnv1a64(self.as_str().as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_normal_names() {
        for ok in ["acme/orders/42", "a/b", "t-1/Job_2.run:x", "0/x"] {
            assert!(ResourceName::parse(ok).is_ok(), "{ok}");
        }
        assert_eq!(
            ResourceName::parse("acme/orders/42").unwrap().tenant(),
            "acme"
        );
    }

    #[test]
    fn dot_segments_are_refused_for_new_locks_only() {
        for (bad, pos) in [
            ("acme/..", 5),
            ("acme/.", 5),
            ("acme/a/../b", 7),
            ("acme/a/./b", 7),
            ("acme/a/..", 7),
        ] {
            let name = ResourceName::parse(bad).expect("still a name that loads");
            assert_eq!(
                name.check_new(),
                Err(NameError::DotSegment { pos }),
                "{bad}"
            );
        }
        for ok in [
            "acme/a..b",
            "acme/.a",
            "acme/a./b",
            "acme/...",
            "acme/x/.../y",
        ] {
            let name = ResourceName::parse(ok).unwrap();
            assert_eq!(name.check_new(), Ok(()), "{ok}");
        }
    }

    #[test]
    fn empty_name_is_refused() {
        assert_eq!(ResourceName::parse(""), Err(NameError::Empty));
    }

    #[test]
    fn name_without_tenant_is_refused() {
        assert_eq!(ResourceName::parse("orders"), Err(NameError::MissingTenant));
        assert_eq!(
            ResourceName::parse("/orders"),
            Err(NameError::MissingTenant)
        );
    }

    #[test]
    fn overlong_name_is_refused() {
        let long = format!("t/{}", "x".repeat(MAX_RESOURCE_NAME_LEN));
        assert!(matches!(
            ResourceName::parse(&long),
            Err(NameError::TooLong { .. })
        ));
        let max = format!("t/{}", "x".repeat(MAX_RESOURCE_NAME_LEN - 2));
        assert!(ResourceName::parse(&max).is_ok());
    }

    #[test]
    fn overlong_tenant_is_refused() {
        let name = format!("{}/x", "t".repeat(MAX_TENANT_LEN + 1));
        assert!(matches!(
            ResourceName::parse(&name),
            Err(NameError::TenantTooLong { .. })
        ));
    }

    #[test]
    fn upper_case_tenant_is_refused_not_rewritten() {
        assert_eq!(
            ResourceName::parse("Acme/x"),
            Err(NameError::InvalidChar { pos: 0, byte: b'A' })
        );
        assert!(matches!(
            ResourceName::parse("-acme/x"),
            Err(NameError::InvalidChar { pos: 0, .. })
        ));
    }

    #[test]
    fn bad_path_bytes_are_refused() {
        assert_eq!(
            ResourceName::parse("acme/a b"),
            Err(NameError::InvalidChar { pos: 6, byte: b' ' })
        );
        assert!(matches!(
            ResourceName::parse("acme/é"),
            Err(NameError::InvalidChar { pos: 5, .. })
        ));
    }

    #[test]
    fn empty_path_segments_are_refused() {
        assert_eq!(
            ResourceName::parse("acme/"),
            Err(NameError::EmptySegment { pos: 5 })
        );
        assert_eq!(
            ResourceName::parse("acme//x"),
            Err(NameError::EmptySegment { pos: 5 })
        );
        assert_eq!(
            ResourceName::parse("acme/x/"),
            Err(NameError::EmptySegment { pos: 7 })
        );
    }
}
