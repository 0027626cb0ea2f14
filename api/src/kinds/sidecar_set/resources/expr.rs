//! The expressions of a SidecarSet's `resourcesPolicy` (`max(cpu*50%, 50m)`,
//! `memory*20% + 100Mi`), as Kruise 1.9's calculator reads and computes them: `+ - * /`,
//! parentheses, unary minus, `max`/`min` of two, numbers (`0.5`, `50%`), quantities
//! (`50m`, `100Mi`) and one variable. A plain number stays a number until it meets a
//! quantity; a quantity times or over a number keeps the quantity's format.
//!
//! Where Kruise's calculator reads a malformed number (`2x`, `5K`) as 0, this one refuses
//! it; expressions are bounded in length and depth (a SidecarSet is outside input).

use super::quantity::{Format, Quantity};

/// A value: a plain number, or a quantity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Number(f64),
    Quantity(Quantity),
}

const MAX_LENGTH: usize = 1024;
const MAX_DEPTH: usize = 32;

impl Value {
    /// A number as a quantity: to the thousandth, truncated (Kruise's `toQuantity`).
    fn quantity(self) -> Result<Quantity, String> {
        match self {
            Value::Quantity(q) => Ok(q),
            Value::Number(n) => Quantity::from_float_milli(n * 1000.0, Format::DecimalSi),
        }
    }

    fn is_negative(&self) -> bool {
        match self {
            Value::Number(n) => *n < 0.0,
            Value::Quantity(q) => q.milli < 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Number(f64),
    Quantity(Quantity),
    Ident(String),
    Op(char),
}

fn tokens(text: &str) -> Result<Vec<Token>, String> {
    if text.len() > MAX_LENGTH {
        return Err(format!("longer than {MAX_LENGTH} characters"));
    }
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        if c.is_whitespace() {
            i += 1;
        } else if "+-*/(),".contains(c) {
            out.push(Token::Op(c));
            i += 1;
        } else if c.is_ascii_alphabetic() {
            let start = i;
            while chars
                .get(i)
                .is_some_and(|c| c.is_ascii_alphanumeric() || *c == '_')
            {
                i += 1;
            }
            out.push(Token::Ident(
                chars[start..i].iter().collect::<String>().to_lowercase(),
            ));
        } else if c.is_ascii_digit() || c == '.' {
            let start = i;
            while chars
                .get(i)
                .is_some_and(|c| c.is_ascii_digit() || *c == '.')
            {
                i += 1;
            }
            // An exponent: `e`, a sign perhaps, digits.
            if chars.get(i).is_some_and(|c| *c == 'e' || *c == 'E') {
                let signed = chars.get(i + 1).is_some_and(|c| *c == '+' || *c == '-');
                let first = i + 1 + usize::from(signed);
                if chars.get(first).is_some_and(char::is_ascii_digit) {
                    i = first;
                    while chars.get(i).is_some_and(char::is_ascii_digit) {
                        i += 1;
                    }
                }
            }
            let number: String = chars[start..i].iter().collect();
            let percent = chars.get(i) == Some(&'%');
            i += usize::from(percent);
            let unit_start = i;
            while chars.get(i).is_some_and(char::is_ascii_alphabetic) {
                i += 1;
            }
            let unit: String = chars[unit_start..i].iter().collect();
            out.push(number_token(&number, percent, &unit)?);
        } else {
            return Err(format!("unexpected {c:?} at column {}", i + 1));
        }
    }
    Ok(out)
}

fn number_token(number: &str, percent: bool, unit: &str) -> Result<Token, String> {
    const UNITS: [&str; 11] = ["m", "k", "M", "G", "T", "P", "Ki", "Mi", "Gi", "Ti", "Pi"];
    match (percent, unit) {
        (false, "") | (true, "") => {
            let value: f64 = number
                .parse()
                .map_err(|_| format!("{number:?} is not a number"))?;
            Ok(Token::Number(if percent { value / 100.0 } else { value }))
        }
        (false, unit) if UNITS.contains(&unit) => Ok(Token::Quantity(Quantity::parse(&format!(
            "{number}{unit}"
        ))?)),
        _ => Err(format!(
            "\"{number}{}{unit}\": a number, a percentage or a quantity in m, k, M, G, T, P, Ki, Mi, Gi, Ti or Pi",
            if percent { "%" } else { "" }
        )),
    }
}

struct Parser<'a> {
    tokens: &'a [Token],
    at: usize,
    variable: (&'a str, Value),
    depth: usize,
}

/// Evaluate `text` with `variable` (its lower-case name and value) the only one defined.
pub fn evaluate(text: &str, variable: (&str, Value)) -> Result<Value, String> {
    let tokens = tokens(text)?;
    let mut parser = Parser {
        tokens: &tokens,
        at: 0,
        variable,
        depth: 0,
    };
    let value = parser.expr()?;
    if let Some(extra) = tokens.get(parser.at) {
        return Err(format!("unexpected {} after the expression", shown(extra)));
    }
    if value.is_negative() {
        return Err(format!(
            "calculation result is negative: {}",
            shown_value(value)
        ));
    }
    Ok(value)
}

fn shown(token: &Token) -> String {
    match token {
        Token::Number(n) => n.to_string(),
        Token::Quantity(q) => q.to_string(),
        Token::Ident(name) => name.clone(),
        Token::Op(c) => format!("{c:?}"),
    }
}

fn shown_value(value: Value) -> String {
    match value {
        Value::Number(n) => n.to_string(),
        Value::Quantity(q) => q.to_string(),
    }
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn eat(&mut self, op: char) -> bool {
        let found = self.peek() == Some(&Token::Op(op));
        self.at += usize::from(found);
        found
    }

    fn expr(&mut self) -> Result<Value, String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(format!("nested deeper than {MAX_DEPTH}"));
        }
        let mut value = self.term()?;
        loop {
            if self.eat('+') {
                value = add(value, self.term()?, false)?;
            } else if self.eat('-') {
                value = add(value, self.term()?, true)?;
            } else {
                break;
            }
        }
        self.depth -= 1;
        Ok(value)
    }

    fn term(&mut self) -> Result<Value, String> {
        let mut value = self.factor()?;
        loop {
            if self.eat('*') {
                value = multiply(value, self.factor()?)?;
            } else if self.eat('/') {
                value = divide(value, self.factor()?)?;
            } else {
                break;
            }
        }
        Ok(value)
    }

    fn factor(&mut self) -> Result<Value, String> {
        let token = self.peek().cloned().ok_or("the expression ends too soon")?;
        self.at += 1;
        match token {
            Token::Number(n) => Ok(Value::Number(n)),
            Token::Quantity(q) => Ok(Value::Quantity(q)),
            Token::Op('(') => {
                let value = self.expr()?;
                self.closing()?;
                Ok(value)
            }
            Token::Op('-') => {
                self.depth += 1;
                if self.depth > MAX_DEPTH {
                    return Err(format!("nested deeper than {MAX_DEPTH}"));
                }
                let value = self.factor()?;
                self.depth -= 1;
                Ok(match value {
                    Value::Number(n) => Value::Number(-n),
                    Value::Quantity(q) => Value::Quantity(Quantity::from_milli(-q.milli, q.format)),
                })
            }
            Token::Ident(name) if self.eat('(') => self.call(&name),
            Token::Ident(name) if name == self.variable.0 => Ok(self.variable.1),
            Token::Ident(name) => Err(format!("undefined variable: {name}")),
            Token::Op(op) => Err(format!("unexpected {op:?}")),
        }
    }

    fn closing(&mut self) -> Result<(), String> {
        if self.eat(')') {
            Ok(())
        } else {
            Err("a ')' is missing".to_owned())
        }
    }

    fn call(&mut self, name: &str) -> Result<Value, String> {
        let mut args = vec![self.expr()?];
        while self.eat(',') {
            args.push(self.expr()?);
        }
        self.closing()?;
        let pick_max = match name {
            "max" => true,
            "min" => false,
            other => return Err(format!("unknown function: {other}")),
        };
        let [left, right] = args[..] else {
            return Err(format!(
                "{name} function requires exactly 2 arguments, got {}",
                args.len()
            ));
        };
        extreme(left, right, pick_max)
    }
}

fn add(left: Value, right: Value, subtract: bool) -> Result<Value, String> {
    match (left, right) {
        (Value::Number(l), Value::Number(r)) => {
            Ok(Value::Number(if subtract { l - r } else { l + r }))
        }
        _ => {
            let (l, r) = (left.quantity()?, right.quantity()?);
            // Both within 10^33: no overflow.
            let milli = if subtract {
                l.milli - r.milli
            } else {
                l.milli + r.milli
            };
            // The format is the left's, unless the left is zero (Kubernetes' `Add`).
            let format = if l.is_zero() { r.format } else { l.format };
            Ok(Value::Quantity(Quantity::checked(milli, format)?))
        }
    }
}

/// `q` times (or over) `by`, in thousandths through a float, truncated (Kruise's rule).
#[allow(clippy::cast_precision_loss)]
fn scaled(q: Quantity, by: f64, over: bool) -> Result<Value, String> {
    let milli = q.milli as f64;
    let milli = if over { milli / by } else { milli * by };
    Ok(Value::Quantity(Quantity::from_float_milli(
        milli, q.format,
    )?))
}

fn multiply(left: Value, right: Value) -> Result<Value, String> {
    match (left, right) {
        (Value::Number(l), Value::Number(r)) => Ok(Value::Number(l * r)),
        (Value::Quantity(q), Value::Number(n)) | (Value::Number(n), Value::Quantity(q)) => {
            scaled(q, n, false)
        }
        (Value::Quantity(_), Value::Quantity(_)) => {
            Err("multiplication of two quantities".to_owned())
        }
    }
}

fn divide(left: Value, right: Value) -> Result<Value, String> {
    match (left, right) {
        (_, Value::Quantity(_)) => Err("division by quantity".to_owned()),
        (_, Value::Number(0.0)) => Err("division by zero".to_owned()),
        (Value::Number(l), Value::Number(r)) => Ok(Value::Number(l / r)),
        (Value::Quantity(q), Value::Number(n)) => scaled(q, n, true),
    }
}

/// `max` (or `min`) of two; a tie keeps the left; a number against a quantity is
/// compared, and returned, as a quantity.
fn extreme(left: Value, right: Value, pick_max: bool) -> Result<Value, String> {
    let left_wins = |l: f64, r: f64| if pick_max { l >= r } else { l <= r };
    Ok(match (left, right) {
        (Value::Number(l), Value::Number(r)) => Value::Number(if left_wins(l, r) { l } else { r }),
        _ => {
            let (l, r) = (left.quantity()?, right.quantity()?);
            let left_first = if pick_max {
                l.milli >= r.milli
            } else {
                l.milli <= r.milli
            };
            Value::Quantity(if left_first { l } else { r })
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn q(text: &str) -> Value {
        Value::Quantity(Quantity::parse(text).unwrap())
    }

    fn shown_result(text: &str, name: &str, value: &str) -> String {
        match evaluate(text, (name, q(value))).unwrap() {
            Value::Quantity(q) => q.to_string(),
            Value::Number(n) => n.to_string(),
        }
    }

    /// Kruise's own cases (`TestEvaluateResourceExpression` and its e2e stories).
    #[test]
    fn expressions_compute_as_kruises_calculator_does() {
        for (text, name, value, expected) in [
            ("cpu*50%", "cpu", "200m", "100m"),
            ("memory*30%", "memory", "600Mi", "180Mi"),
            ("max(cpu*50%, 100m)", "cpu", "150m", "100m"),
            ("max(cpu*50%, 100m)", "cpu", "400m", "200m"),
            ("cpu + 50m", "cpu", "100m", "150m"),
            ("max(memory*20% + 100Mi, 200Mi)", "memory", "800Mi", "260Mi"),
            ("500m", "cpu", "100m", "500m"),
            ("1Gi", "memory", "500Mi", "1Gi"),
            ("memory*25%", "memory", "400Mi", "100Mi"),
            ("cpu*50% + 100m", "cpu", "600m", "400m"),
            ("memory*15% + 50Mi", "memory", "500Mi", "125Mi"),
            ("CPU * 0.5", "cpu", "1", "500m"),
            ("-2*-3", "cpu", "1", "6"),
            ("(1 + 2) * 3", "cpu", "1", "9"),
            ("cpu / 4", "cpu", "1", "250m"),
            ("min(cpu, 2)", "cpu", "3", "2"),
        ] {
            assert_eq!(
                shown_result(text, name, value),
                expected,
                "{text} with {name} = {value}"
            );
        }
    }

    #[test]
    fn bad_expressions_are_refused_with_the_cause() {
        for (text, cause) in [
            ("cpu * invalid", "undefined variable: invalid"),
            ("invalid expression @#$", "unexpected '@'"),
            ("max(cpu*50%, 50m", "')' is missing"),
            (
                "max(cpu*50%)",
                "max function requires exactly 2 arguments, got 1",
            ),
            ("foo(cpu)", "unknown function: foo"),
            ("cpu +*/ 50%", "unexpected '*'"),
            ("cpu - 2", "calculation result is negative"),
            ("cpu * cpu", "multiplication of two quantities"),
            ("1 / cpu", "division by quantity"),
            ("cpu / 0", "division by zero"),
            ("2x", "\"2x\""),
            ("5K", "\"5K\""),
            ("cpu @ 2", "unexpected '@'"),
            ("", "ends too soon"),
            ("cpu 2", "after the expression"),
        ] {
            let error = evaluate(text, ("cpu", q("1"))).unwrap_err();
            assert!(error.contains(cause), "{text}: {error}");
        }
        let deep = format!("{}cpu{}", "(".repeat(100), ")".repeat(100));
        assert!(
            evaluate(&deep, ("cpu", q("1")))
                .unwrap_err()
                .contains("nested deeper")
        );
        let negated = format!("{}cpu", "-".repeat(100));
        assert!(
            evaluate(&negated, ("cpu", q("1")))
                .unwrap_err()
                .contains("nested deeper")
        );
        for huge in [
            "cpu * 1e300",
            "cpu / 1e-300",
            "max(1e300, cpu)",
            "2Pi * 1e20 + cpu",
        ] {
            let error = evaluate(huge, ("cpu", q("1"))).unwrap_err();
            assert!(error.contains("too large"), "{huge}: {error}");
        }
        let long = "1+".repeat(600) + "1";
        assert!(
            evaluate(&long, ("cpu", q("1")))
                .unwrap_err()
                .contains("longer than")
        );
    }
}
