//! Integers as JSON Schema counts them: `3` and `3.0` are the same
//! integer, so a field typed `integer` reads both (and refuses `3.5`, a
//! negative or an out-of-range number, with serde's usual message).

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserializer, Unexpected, Visitor};

struct Integral<T>(PhantomData<T>);

impl<T: TryFrom<u64>> Integral<T> {
    fn fit<E: de::Error>(&self, v: u64) -> Result<T, E> {
        T::try_from(v).map_err(|_| E::invalid_value(Unexpected::Unsigned(v), self))
    }
}

impl<'de, T: TryFrom<u64>> Visitor<'de> for Integral<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a non-negative integer of at most {} bits", std::mem::size_of::<T>() * 8)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        self.fit(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        u64::try_from(v).map_err(|_| E::invalid_value(Unexpected::Signed(v), &self)).and_then(|v| self.fit(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
        // 2^64 is the first float above u64::MAX.
        if v.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&v) {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            return self.fit(v as u64);
        }
        Err(E::invalid_value(Unexpected::Float(v), &self))
    }
}

/// An integer field: `#[serde(deserialize_with = "crate::int::exact")]`.
pub fn exact<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<T, D::Error> {
    d.deserialize_any(Integral(PhantomData))
}

/// An optional integer field (`null` is none):
/// `#[serde(default, deserialize_with = "crate::int::option")]`.
pub fn option<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<Option<T>, D::Error> {
    struct Maybe<T>(PhantomData<T>);
    impl<'de, T: TryFrom<u64>> Visitor<'de> for Maybe<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("null or a non-negative integer")
        }
        fn visit_none<E: de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<T>, D::Error> {
            exact(d).map(Some)
        }
    }
    d.deserialize_option(Maybe(PhantomData))
}

#[cfg(test)]
mod tests {
    #[derive(serde::Deserialize, Debug)]
    struct T {
        #[serde(deserialize_with = "super::exact")]
        a: u32,
        #[serde(default, deserialize_with = "super::option")]
        b: Option<u16>,
    }

    #[test]
    fn integral_numbers_are_integers() {
        let t: T = serde_json::from_str(r#"{"a": 3.0, "b": 599}"#).unwrap();
        assert_eq!((t.a, t.b), (3, Some(599)));
        let t: T = serde_json::from_str(r#"{"a": 7, "b": null}"#).unwrap();
        assert_eq!((t.a, t.b), (7, None));
        assert_eq!(serde_json::from_str::<T>(r#"{"a": 1}"#).unwrap().b, None);
        for bad in [r#"{"a": 3.5}"#, r#"{"a": -1}"#, r#"{"a": 4294967296}"#, r#"{"a": "3"}"#, r#"{"a": 1, "b": 70000}"#, r#"{"a": 1e300}"#]
        {
            assert!(serde_json::from_str::<T>(bad).is_err(), "{bad}");
        }
    }
}
