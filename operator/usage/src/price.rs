//! What tokens cost: a price table per model, in integer micro-dollars.
//!
//! Prices are written as decimal dollars per million tokens (`"3"`,
//! `"0.075"`, at most six decimals), parsed exactly into micro-dollars per
//! million tokens, and a call's cost is computed in integers (`u128`, rounded
//! to the nearest micro-dollar): no float touches money. A model the table
//! does not name has no cost ([`PriceTable::cost`] is `None`): its tokens are
//! still recorded and its cost shows as unknown.
//!
//! A model matches its exact name first, then the longest table entry that
//! it extends with `-…` (an answer naming `gpt-4o-2024-08-06` is priced by
//! an entry `gpt-4o`), so a table need not list every dated snapshot.

use std::{collections::BTreeMap, fmt, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::tokens::TokenCounts;

/// An amount of money in micro-dollars (millionths of a US dollar).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Microdollars(pub u64);

impl Microdollars {
    /// Adds, saturating.
    pub fn saturating_add(self, other: Microdollars) -> Microdollars {
        Microdollars(self.0.saturating_add(other.0))
    }
}

impl fmt::Display for Microdollars {
    /// Dollars with six decimals, e.g. `$0.001250`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "${}.{:06}", self.0 / 1_000_000, self.0 % 1_000_000)
    }
}

/// Why a price is not a price.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{text:?} is not a price: write decimal dollars per million tokens, e.g. \"3\" or \"0.075\" (at most 6 decimals, no sign, no exponent)"
)]
pub struct PriceError {
    /// The text as written.
    pub text: String,
}

/// Dollars per million tokens, held as micro-dollars per million tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct PerMillion(pub u64);

impl FromStr for PerMillion {
    type Err = PriceError;

    fn from_str(text: &str) -> Result<PerMillion, PriceError> {
        let bad = || PriceError {
            text: text.chars().take(64).collect(),
        };
        let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
        let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if whole.is_empty() || !digits(whole) || !digits(fraction) || fraction.len() > 6 {
            return Err(bad());
        }
        if text.contains('.') && fraction.is_empty() {
            return Err(bad());
        }
        let whole: u64 = whole.parse().map_err(|_| bad())?;
        let mut micros: u64 = 0;
        for (i, b) in fraction.bytes().enumerate() {
            let digit = u64::from(b - b'0');
            micros += digit * 10u64.pow(5 - i as u32);
        }
        whole
            .checked_mul(1_000_000)
            .and_then(|w| w.checked_add(micros))
            .map(PerMillion)
            .ok_or_else(bad)
    }
}

impl fmt::Display for PerMillion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (whole, micros) = (self.0 / 1_000_000, self.0 % 1_000_000);
        if micros == 0 {
            return write!(f, "{whole}");
        }
        let fraction = format!("{micros:06}");
        write!(f, "{whole}.{}", fraction.trim_end_matches('0'))
    }
}

impl Serialize for PerMillion {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PerMillion {
    /// A quoted decimal (`"0.075"`) or a whole number of dollars (`3`); a
    /// bare fractional number is refused, since a float may already have
    /// rounded it.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<PerMillion, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = PerMillion;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("dollars per million tokens as a quoted decimal, e.g. \"0.075\"")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<PerMillion, E> {
                text.parse().map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, whole: u64) -> Result<PerMillion, E> {
                whole.checked_mul(1_000_000).map(PerMillion).ok_or_else(|| {
                    E::custom(format!("{whole} dollars per million tokens is too large"))
                })
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<PerMillion, E> {
                match u64::try_from(n) {
                    Ok(whole) => self.visit_u64(whole),
                    Err(_) => Err(E::custom(format!("{n} is negative: a price is at least 0"))),
                }
            }
            fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<PerMillion, E> {
                Err(E::custom(format!(
                    "{n} is a bare fractional number: quote it (\"{n}\") so no float rounds the price"
                )))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// One model's prices, dollars per million tokens of each kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelPrice {
    /// Fresh input.
    pub input: PerMillion,
    /// Output (reasoning included).
    pub output: PerMillion,
    /// Input read from the prompt cache (defaults to 0).
    #[serde(default)]
    pub cache_read: PerMillion,
    /// Input written to the prompt cache (defaults to 0).
    #[serde(default)]
    pub cache_write: PerMillion,
}

impl ModelPrice {
    /// The cost of `tokens` at these prices, rounded to the nearest
    /// micro-dollar (saturating at `u64::MAX`).
    pub fn cost(&self, tokens: &TokenCounts) -> Microdollars {
        let term = |n: u64, p: PerMillion| u128::from(n) * u128::from(p.0);
        let scaled = term(tokens.input, self.input)
            .saturating_add(term(tokens.output, self.output))
            .saturating_add(term(tokens.cache_read, self.cache_read))
            .saturating_add(term(tokens.cache_write, self.cache_write));
        let rounded = scaled.saturating_add(500_000) / 1_000_000;
        Microdollars(u64::try_from(rounded).unwrap_or(u64::MAX))
    }
}

/// Prices by model name (`prices` of a worker class and the proxy's
/// `--prices` file).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PriceTable(pub BTreeMap<String, ModelPrice>);

impl PriceTable {
    /// The price of `model`: its exact entry, else the longest entry it
    /// extends with `-…`.
    pub fn price_of(&self, model: &str) -> Option<&ModelPrice> {
        if let Some(price) = self.0.get(model) {
            return Some(price);
        }
        self.0
            .iter()
            .filter(|(name, _)| {
                model
                    .strip_prefix(name.as_str())
                    .is_some_and(|rest| rest.starts_with('-'))
            })
            .max_by_key(|(name, _)| name.len())
            .map(|(_, price)| price)
    }

    /// The cost of `tokens` of `model`, or `None` when the table does not
    /// price the model.
    pub fn cost(&self, model: &str, tokens: &TokenCounts) -> Option<Microdollars> {
        self.price_of(model).map(|p| p.cost(tokens))
    }

    /// Whether no model is priced.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pm(text: &str) -> PerMillion {
        text.parse().unwrap()
    }

    #[test]
    fn decimal_dollars_parse_exactly() {
        assert_eq!(pm("3"), PerMillion(3_000_000));
        assert_eq!(pm("0.075"), PerMillion(75_000));
        assert_eq!(pm("15.000001"), PerMillion(15_000_001));
        assert_eq!(pm("0"), PerMillion(0));
        for bad in [
            "",
            ".5",
            "1.",
            "-1",
            "+1",
            "1e3",
            "0.0000001",
            "1,5",
            " 1",
            "NaN",
            "99999999999999999999",
        ] {
            let error = bad.parse::<PerMillion>().unwrap_err();
            assert!(error.to_string().contains("decimal dollars"), "{bad}");
        }
        for text in ["3", "0.075", "15.000001", "0"] {
            assert_eq!(pm(text).to_string(), text);
        }
    }

    #[test]
    fn cost_is_integer_and_rounded_to_the_nearest_microdollar() {
        let price = ModelPrice {
            input: pm("3"),
            output: pm("15"),
            cache_read: pm("0.3"),
            cache_write: pm("3.75"),
        };
        let tokens = TokenCounts {
            input: 1_000,
            output: 500,
            cache_read: 10_000,
            cache_write: 2_000,
            reasoning: 400,
        };
        // 3000 + 7500 + 3000 + 7500 micro-dollars; reasoning is inside output.
        assert_eq!(price.cost(&tokens), Microdollars(21_000));
        let one = TokenCounts {
            input: 1,
            ..TokenCounts::default()
        };
        assert_eq!(
            ModelPrice {
                input: pm("0.4"),
                ..ModelPrice::default()
            }
            .cost(&one),
            Microdollars(0)
        );
        assert_eq!(
            ModelPrice {
                input: pm("0.5"),
                ..ModelPrice::default()
            }
            .cost(&one),
            Microdollars(1)
        );
        let huge = TokenCounts {
            input: u64::MAX,
            output: u64::MAX,
            ..TokenCounts::default()
        };
        assert_eq!(
            ModelPrice {
                input: PerMillion(u64::MAX),
                output: PerMillion(u64::MAX),
                ..ModelPrice::default()
            }
            .cost(&huge),
            Microdollars(u64::MAX)
        );
        assert_eq!(Microdollars(21_000).to_string(), "$0.021000");
    }

    #[test]
    fn a_dated_snapshot_takes_its_family_price_and_unknown_models_have_none() {
        let table: PriceTable = serde_yaml_ng::from_str(
            "gpt-4o: {input: \"2.5\", output: \"10\"}\n\
             gpt-4o-mini: {input: \"0.15\", output: \"0.6\", cacheRead: \"0.075\"}\n",
        )
        .unwrap();
        assert_eq!(table.price_of("gpt-4o").unwrap().input, pm("2.5"));
        assert_eq!(
            table.price_of("gpt-4o-mini-2024-07-18").unwrap().input,
            pm("0.15")
        );
        assert_eq!(
            table.price_of("gpt-4o-2024-08-06").unwrap().input,
            pm("2.5")
        );
        assert!(table.price_of("gpt-4").is_none());
        assert!(table.price_of("gpt-4oxyz").is_none());
        assert!(table.cost("claude", &TokenCounts::default()).is_none());
        let unknown =
            serde_yaml_ng::from_str::<PriceTable>("m: {input: \"1\", output: \"1\", extra: \"1\"}");
        assert!(unknown.is_err());
        let bad = serde_yaml_ng::from_str::<PriceTable>("m: {input: 1.5, output: \"1\"}")
            .unwrap_err()
            .to_string();
        assert!(bad.contains("quote it"), "{bad}");
        let whole: PriceTable = serde_yaml_ng::from_str("m: {input: 3, output: \"15\"}").unwrap();
        assert_eq!(whole.price_of("m").unwrap().input, pm("3"));
        assert!(serde_yaml_ng::from_str::<PriceTable>("m: {input: -3, output: \"1\"}").is_err());
    }
}
