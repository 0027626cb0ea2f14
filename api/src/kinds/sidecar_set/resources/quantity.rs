//! Kubernetes resource quantities (`250m`, `1.5`, `180Mi`, `2e3`) to the thousandth, as a
//! SidecarSet's `resourcesPolicy` computes with them: Kruise's calculator works in
//! thousandths (`MilliValue`/`SetMilli`), and prints a result as the API server
//! canonicalises it, in the format of the quantity it came from.

use std::fmt;

/// How a quantity is written, which its canonical text keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `m`, none, `k`, `M`, `G`, `T`, `P`, `E`.
    DecimalSi,
    /// `Ki` … `Ei`.
    BinarySi,
    /// `1e3`.
    DecimalExponent,
}

/// A quantity in thousandths of its unit (cores for CPU, bytes for memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity {
    pub milli: i128,
    pub format: Format,
}

/// Past this (in thousandths, about 10^33) a quantity is refused rather than overflowing.
const LIMIT: i128 = 1_000_000_000_000_000_000_000_000_000_000_000;

impl Quantity {
    pub fn from_milli(milli: i128, format: Format) -> Quantity {
        Quantity { milli, format }
    }

    /// `milli` thousandths, refused past about 10^30 (so no sum or print overflows).
    pub fn checked(milli: i128, format: Format) -> Result<Quantity, String> {
        if milli.unsigned_abs() > LIMIT.unsigned_abs() {
            return Err("the result is too large".to_owned());
        }
        Ok(Quantity { milli, format })
    }

    /// `milli` thousandths from a float (Kruise's calculator multiplies in floats),
    /// truncated; refused when not finite or too large.
    #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
    pub fn from_float_milli(milli: f64, format: Format) -> Result<Quantity, String> {
        if !milli.is_finite() || milli.abs() > LIMIT as f64 {
            return Err("the result is too large".to_owned());
        }
        Quantity::checked(milli as i128, format)
    }

    pub fn is_zero(&self) -> bool {
        self.milli == 0
    }

    /// `text` as the API server reads a quantity; the cause when it is not one.
    pub fn parse(text: &str) -> Result<Quantity, String> {
        let bad = |why: &str| format!("{text:?} is not a quantity: {why}");
        let (negative, body) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        let number_end = body
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(body.len());
        let (number, suffix) = body.split_at(number_end);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
            return Err(bad("no number"));
        }
        if whole.len() + fraction.len() > 30 {
            return Err(bad("too many digits"));
        }
        let digits: i128 = format!("{whole}{fraction}")
            .parse()
            .map_err(|_| bad("no number"))?;
        // value = digits × 10^(ten − fraction digits) × 1024^binary, in thousandths.
        let (format, ten, binary): (Format, i32, u32) = match suffix {
            "" => (Format::DecimalSi, 0, 0),
            "n" => (Format::DecimalSi, -9, 0),
            "u" => (Format::DecimalSi, -6, 0),
            "m" => (Format::DecimalSi, -3, 0),
            "k" => (Format::DecimalSi, 3, 0),
            "M" => (Format::DecimalSi, 6, 0),
            "G" => (Format::DecimalSi, 9, 0),
            "T" => (Format::DecimalSi, 12, 0),
            "P" => (Format::DecimalSi, 15, 0),
            "E" => (Format::DecimalSi, 18, 0),
            "Ki" => (Format::BinarySi, 0, 1),
            "Mi" => (Format::BinarySi, 0, 2),
            "Gi" => (Format::BinarySi, 0, 3),
            "Ti" => (Format::BinarySi, 0, 4),
            "Pi" => (Format::BinarySi, 0, 5),
            "Ei" => (Format::BinarySi, 0, 6),
            exponent => {
                let power = exponent
                    .strip_prefix(['e', 'E'])
                    .and_then(|p| p.parse::<i32>().ok())
                    .filter(|p| p.abs() <= 30)
                    .ok_or_else(|| bad("unknown suffix"))?;
                (Format::DecimalExponent, power, 0)
            }
        };
        let fraction_digits = i32::try_from(fraction.len()).map_err(|_| bad("too many digits"))?;
        let ten = ten + 3 - fraction_digits;
        let mut milli = digits
            .checked_mul(1024_i128.pow(binary))
            .ok_or_else(|| bad("too large"))?;
        if ten >= 0 {
            milli = 10_i128
                .checked_pow(ten.unsigned_abs())
                .and_then(|scale| milli.checked_mul(scale))
                .ok_or_else(|| bad("too large"))?;
        } else {
            // Rounded up to the thousandth, as `MilliValue` rounds.
            let scale = 10_i128
                .checked_pow(ten.unsigned_abs())
                .ok_or_else(|| bad("too small"))?;
            milli = (milli + scale - 1) / scale;
        }
        if milli > LIMIT {
            return Err(bad("too large"));
        }
        Ok(Quantity {
            milli: if negative { -milli } else { milli },
            format,
        })
    }

    /// Whether the value is whole and at least 1024 (printed in `Ki` … `Ei` if binary).
    fn binary_mantissa(&self) -> Option<(i128, &'static str)> {
        if self.milli % 1000 != 0 || self.milli.abs() < 1024 * 1000 {
            return None;
        }
        let mut value = self.milli / 1000;
        let mut suffix = "";
        for next in ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"] {
            if value % 1024 != 0 {
                break;
            }
            value /= 1024;
            suffix = next;
        }
        Some((value, suffix))
    }
}

impl fmt::Display for Quantity {
    /// The API server's canonical text: the mantissa whole, the exponent a multiple of 3
    /// (`1500m`, `2k`, `500m`), binary quantities in the largest whole `Ki` … `Ei`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.format == Format::BinarySi
            && let Some((mantissa, suffix)) = self.binary_mantissa()
        {
            return write!(f, "{mantissa}{suffix}");
        }
        if self.milli == 0 {
            return f.write_str("0");
        }
        let (mut mantissa, mut exponent) = (self.milli, -3_i32);
        while mantissa % 10 == 0 {
            mantissa /= 10;
            exponent += 1;
        }
        while exponent.rem_euclid(3) != 0 {
            mantissa *= 10;
            exponent -= 1;
        }
        if self.format == Format::DecimalExponent {
            return match exponent {
                0 => write!(f, "{mantissa}"),
                e => write!(f, "{mantissa}e{e}"),
            };
        }
        while exponent > 18 {
            mantissa *= 1000;
            exponent -= 3;
        }
        let suffix = match exponent {
            -3 => "m",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            18 => "E",
            _ => "",
        };
        write!(f, "{mantissa}{suffix}")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn quantities_read_and_print_as_the_api_server_does() {
        for (text, canonical) in [
            ("1500m", "1500m"),
            ("2000", "2k"),
            ("0.5", "500m"),
            ("100Mi", "100Mi"),
            ("1536Mi", "1536Mi"),
            ("1024Mi", "1Gi"),
            ("1000Ki", "1000Ki"),
            ("512", "512"),
            ("2e3", "2e3"),
            ("1.5Gi", "1536Mi"),
            ("0", "0"),
            ("1n", "1m"),
        ] {
            assert_eq!(
                Quantity::parse(text).unwrap().to_string(),
                canonical,
                "{text}"
            );
        }
        assert_eq!(Quantity::parse("250m").unwrap().milli, 250);
        assert_eq!(Quantity::parse("1Ki").unwrap().milli, 1_024_000);
    }

    #[test]
    fn what_is_not_a_quantity_is_refused_with_its_text() {
        for text in [
            "",
            "m",
            "1.2.3",
            "5K",
            "1x",
            "1e99",
            "99999999999999999999999999999999Ei",
            "1..5",
        ] {
            let error = Quantity::parse(text).unwrap_err();
            assert!(error.contains(&format!("{text:?}")), "{error}");
        }
    }
}
