//! Kubernetes release versions. Anything that may reach a shell on a node passes through
//! [`Version::parse`] first, so only `MAJOR.MINOR.PATCH` with plain digits ever gets there.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// A release version `MAJOR.MINOR.PATCH`, digits only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Major number, `1` for every Kubernetes release so far.
    pub major: u32,
    /// Minor number, the `34` of `1.34.5`.
    pub minor: u32,
    /// Patch number, the `5` of `1.34.5`.
    pub patch: u32,
}

/// Why a string is not a version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{input:?} is not a version: {why} (expected MAJOR.MINOR.PATCH with digits only, e.g. 1.34.5)"
)]
pub struct VersionError {
    input: String,
    why: &'static str,
}

/// The longest accepted input; longer strings are rejected before any work.
const MAX_LEN: usize = 32;
/// Enough digits for any real release number, few enough never to overflow `u32`.
const MAX_DIGITS: usize = 6;

impl Version {
    /// Parses exactly `MAJOR.MINOR.PATCH`: three dot-separated runs of ASCII digits, no
    /// sign, no `v` prefix, no whitespace, no leading zeros, no suffix.
    pub fn parse(input: &str) -> Result<Self, VersionError> {
        let fail = |why| VersionError {
            input: input.chars().take(MAX_LEN).collect(),
            why,
        };
        if input.len() > MAX_LEN {
            return Err(fail("too long"));
        }
        let parts: Vec<&str> = input.split('.').collect();
        if parts.len() != 3 {
            return Err(fail("it must have exactly three dot-separated numbers"));
        }
        let mut numbers = [0u32; 3];
        for (slot, part) in numbers.iter_mut().zip(&parts) {
            if part.is_empty() {
                return Err(fail("a number is empty"));
            }
            if !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(fail("only the digits 0-9 and two dots are allowed"));
            }
            if part.len() > MAX_DIGITS {
                return Err(fail("a number has too many digits"));
            }
            if part.len() > 1 && part.starts_with('0') {
                return Err(fail("a number has a leading zero"));
            }
            *slot = part.parse().map_err(|_| fail("a number is out of range"))?;
        }
        Ok(Self {
            major: numbers[0],
            minor: numbers[1],
            patch: numbers[2],
        })
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl FromStr for Version {
    type Err = VersionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Serialize for Version {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Version::parse(&raw).map_err(serde::de::Error::custom)
    }
}

/// The release of a Debian package version like `1.34.5-1.1`; `None` for pre-releases
/// (`1.35.0~rc.1-1.1`) and anything else.
pub fn debian_release(package_version: &str) -> Option<Version> {
    let upstream = package_version
        .split_once('-')
        .map_or(package_version, |(u, _)| u);
    Version::parse(upstream).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_versions() {
        for (input, expected) in [
            ("1.34.5", (1, 34, 5)),
            ("0.0.0", (0, 0, 0)),
            ("1.0.10", (1, 0, 10)),
            ("999999.1.2", (999_999, 1, 2)),
        ] {
            let v = Version::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!((v.major, v.minor, v.patch), expected, "{input}");
            assert_eq!(v.to_string(), input);
        }
    }

    #[test]
    fn rejects_everything_else() {
        for input in [
            "",
            "1.34",
            "1.34.5.1",
            "v1.34.5",
            "1.34.5-rc.1",
            "1.34.5 ",
            " 1.34.5",
            "1.34.5;reboot",
            "1.34.$(id)",
            "1.34.`id`",
            "1..5",
            "1.34.05",
            "+1.34.5",
            "1.34.٣",
            "1.34.5\n",
            "1.34.1234567",
            "1.34.5&&true",
        ] {
            assert!(Version::parse(input).is_err(), "{input:?} must be rejected");
        }
    }

    #[test]
    fn orders_numerically() {
        let a = Version::parse("1.9.10").unwrap();
        let b = Version::parse("1.10.0").unwrap();
        assert!(a < b);
    }

    #[test]
    fn error_message_tells_the_expected_form() {
        let err = Version::parse("1.34").unwrap_err().to_string();
        assert!(err.contains("MAJOR.MINOR.PATCH"), "{err}");
    }
}
