//! Typed access to the keys of one JSON object ([`Fields`]), with errors naming origin and key, and the size syntax
//! (`"4gb"`, [`parse_size`]).

use serde_json::{Map, Value};

use super::ConfigError;

/// Typed access to the keys of one JSON object, with errors naming origin and key.
pub(super) struct Fields<'a> {
    pub(super) origin: &'a str,
    pub(super) object: &'a Map<String, Value>,
    pub(super) prefix: &'static str,
}

impl Fields<'_> {
    pub(super) fn invalid(&self, key: &str, expected: &str, found: &Value) -> ConfigError {
        ConfigError::Invalid {
            origin: self.origin.to_owned(),
            key: format!("{}{key}", self.prefix),
            expected: expected.to_owned(),
            found: describe(found),
        }
    }

    pub(super) fn string(&self, key: &str) -> Result<Option<String>, ConfigError> {
        match self.object.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(other) => Err(self.invalid(key, "a string", other)),
        }
    }

    pub(super) fn boolean(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        match self.object.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(on)) => Ok(Some(*on)),
            Some(other) => Err(self.invalid(key, "true or false", other)),
        }
    }

    pub(super) fn integer(&self, key: &str, min: u64, max: u64) -> Result<Option<u64>, ConfigError> {
        let value = match self.object.get(key) {
            None | Some(Value::Null) => return Ok(None),
            Some(value) => value,
        };
        let expected = format!("an integer from {min} to {max}");
        let number = match value {
            Value::Number(number) => number.as_u64(),
            Value::String(text) => text.trim().parse::<u64>().ok(),
            _ => None,
        };
        match number {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(self.invalid(key, &expected, value)),
        }
    }

    pub(super) fn power_of_two(&self, key: &str, min: u64, max: u64) -> Result<Option<u32>, ConfigError> {
        match self.integer(key, min, max)? {
            Some(n) if n.is_power_of_two() => Ok(Some(n as u32)),
            Some(n) => Err(self.invalid(key, &format!("a power of two from {min} to {max}"), &Value::from(n))),
            None => Ok(None),
        }
    }

    pub(super) fn size(&self, key: &str) -> Result<Option<u64>, ConfigError> {
        match self.object.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(number)) => match number.as_u64() {
                Some(n) => Ok(Some(n)),
                None => Err(self.invalid(
                    key,
                    "a size in bytes or a string such as \"4gb\"",
                    &Value::Number(number.clone()),
                )),
            },
            Some(Value::String(text)) => parse_size(text).map(Some).map_err(|reason| {
                self.invalid(key, &format!("a size such as \"512mb\" ({reason})"), &Value::String(text.clone()))
            }),
            Some(other) => Err(self.invalid(key, "a size in bytes or a string such as \"4gb\"", other)),
        }
    }
}

/// Parses a size: a number of bytes with an optional suffix `b`, `k`/`kb`/`kib`, `m`/`mb`/`mib`, `g`/`gb`/`gib`,
/// `t`/`tb`/`tib` (case-insensitive, binary multiples as Mooncake uses them); a fraction such as `1.5gb` is allowed.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let lower = text.trim().to_ascii_lowercase();
    let split = lower.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(lower.len());
    let (number, unit) = lower.split_at(split);
    let shift = match unit.trim() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => return Err(format!("unknown unit {other:?}")),
    };
    if number.is_empty() {
        return Err("no number".into());
    }
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_shl(shift).filter(|v| v >> shift == whole).ok_or_else(|| "too large".into());
    }
    let fraction: f64 = number.parse().map_err(|_| format!("{number:?} is not a number"))?;
    let bytes = fraction * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err("too large".into());
    }
    Ok(bytes.round() as u64)
}

pub(super) fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn describe(value: &Value) -> String {
    match value {
        Value::String(text) => format!("{text:?}"),
        Value::Number(number) => number.to_string(),
        Value::Bool(flag) => flag.to_string(),
        other => kind_of(other).to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4gb"), Ok(4 << 30));
        assert_eq!(parse_size("512MB"), Ok(512 << 20));
        assert_eq!(parse_size("1.5 kb"), Ok(1536));
        assert_eq!(parse_size("100"), Ok(100));
        assert_eq!(parse_size("64kib"), Ok(64 << 10));
        assert!(parse_size("gb").is_err());
        assert!(parse_size("99999999999tb").is_err());
        assert!(parse_size("12 furlongs").is_err());
    }
}
