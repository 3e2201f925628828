//! A small JSON object writer for `--output json`: enough for the CLI's
//! answers (strings, integers, booleans, lists of objects) without a JSON
//! dependency.

use std::fmt::Write as _;

/// One JSON value of a flat object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Str(String),
    U64(u64),
    I64(i64),
    Bool(bool),
    /// A list of objects (admin listings).
    List(Vec<Object>),
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::Str(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::Str(s)
    }
}

impl From<u64> for Value {
    fn from(n: u64) -> Value {
        Value::U64(n)
    }
}

impl From<u32> for Value {
    fn from(n: u32) -> Value {
        Value::U64(u64::from(n))
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Value {
        Value::I64(n)
    }
}

impl From<Vec<Object>> for Value {
    fn from(items: Vec<Object>) -> Value {
        Value::List(items)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Value {
        Value::Bool(b)
    }
}

/// An object whose keys keep their insertion order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Object {
    fields: Vec<(&'static str, Value)>,
}

impl Object {
    pub fn new() -> Object {
        Object::default()
    }

    /// Adds a field (builder style).
    pub fn with(mut self, key: &'static str, value: impl Into<Value>) -> Object {
        self.fields.push((key, value.into()));
        self
    }

    /// The object on one line.
    pub fn render(&self) -> String {
        let mut out = String::from("{");
        for (i, (key, value)) in self.fields.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            quote(&mut out, key);
            out.push(':');
            match value {
                Value::Str(s) => quote(&mut out, s),
                Value::U64(n) => write!(out, "{n}").expect("writing to a String"),
                Value::I64(n) => write!(out, "{n}").expect("writing to a String"),
                Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
                Value::List(items) => {
                    out.push('[');
                    for (i, item) in items.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        out.push_str(&item.render());
                    }
                    out.push(']');
                }
            }
        }
        out.push('}');
        out
    }

    /// The fields, for the human-readable output.
    pub fn fields(&self) -> &[(&'static str, Value)] {
        &self.fields
    }
}

/// Appends `s` as a JSON string literal (RFC 8259 escapes).
fn quote(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                write!(out, "\\u{:04x}", u32::from(c)).expect("writing to a String")
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Str(s) => write!(f, "{s}"),
            Value::U64(n) => write!(f, "{n}"),
            Value::I64(n) => write!(f, "{n}"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::List(items) => write!(f, "{} items", items.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_flat_object_with_escapes() {
        let object = Object::new()
            .with("s", "a\"b\\c\nd\u{1}é")
            .with("u", u64::MAX)
            .with("i", -5i64)
            .with("b", true);
        assert_eq!(
            object.render(),
            r#"{"s":"a\"b\\c\nd\u0001é","u":18446744073709551615,"i":-5,"b":true}"#
        );
        assert_eq!(Object::new().render(), "{}");
        let list = Object::new().with("l", vec![Object::new().with("a", 1u64), Object::new()]);
        assert_eq!(list.render(), r#"{"l":[{"a":1},{}]}"#);
    }
}
