//! Tokens to a [`Query`].

use gpux_protocol::{
    ComputeCapability, EvidenceTier, GpuFamily, ImageDigest, MicroCredits, PeerId, PublicKey,
    Version,
};

use super::lexer::{CompareOp, Token, TokenKind, tokenize};
use super::{
    Clause, Field, MAX_CLAUSES, MAX_LIST_VALUES, MAX_QUERY_BYTES, OrderKey, Ordering, Query,
    QueryError, QueryErrorKind, Value, closest,
};

/// Parses query text into a [`Query`]. See the [module docs](super).
pub fn parse(text: &str) -> Result<Query, QueryError> {
    if text.len() > MAX_QUERY_BYTES {
        return Err(QueryError {
            column: 1,
            kind: QueryErrorKind::TooLong { len: text.len() },
        });
    }
    let tokens = tokenize(text)?;
    let mut parser = Parser {
        tokens,
        pos: 0,
        end_column: text.chars().count() + 1,
    };
    let mut query = Query::default();
    while let Some(token) = parser.next() {
        let column = token.column;
        let TokenKind::Word(name) = token.kind else {
            return Err(err(
                column,
                QueryErrorKind::UnexpectedToken(describe(&token.kind)),
            ));
        };
        let lower = name.to_ascii_lowercase();
        if lower == "order" {
            query.order = parser.order()?;
            continue;
        }
        let field = Field::ALL
            .iter()
            .find(|(_, n)| *n == lower)
            .map(|(f, _)| *f)
            .ok_or_else(|| {
                let names = Field::ALL.iter().map(|(_, n)| *n).chain(["order"]);
                err(
                    column,
                    QueryErrorKind::UnknownField {
                        name: name.clone(),
                        suggestion: closest(&lower, names),
                    },
                )
            })?;
        if query.clauses.len() >= MAX_CLAUSES {
            return Err(err(
                column,
                QueryErrorKind::TooMany {
                    what: "clauses",
                    max: MAX_CLAUSES,
                },
            ));
        }
        let (op, op_column) = parser.operator(&name)?;
        if !field.is_ordered()
            && matches!(
                op,
                CompareOp::Lt | CompareOp::Le | CompareOp::Gt | CompareOp::Ge
            )
        {
            return Err(err(
                op_column,
                QueryErrorKind::OperatorNotAllowed { field, op },
            ));
        }
        let values = match op {
            CompareOp::In | CompareOp::NotIn => parser.list(field)?,
            _ => vec![parser.value(field)?],
        };
        query.clauses.push(Clause {
            field,
            op,
            values,
            column,
        });
    }
    Ok(query)
}

fn err(column: usize, kind: QueryErrorKind) -> QueryError {
    QueryError { column, kind }
}

fn describe(kind: &TokenKind) -> String {
    match kind {
        TokenKind::Word(w) => w.clone(),
        TokenKind::Op(op) => op.as_str().to_string(),
        TokenKind::LBracket => "[".into(),
        TokenKind::RBracket => "]".into(),
        TokenKind::Comma => ",".into(),
    }
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
    end_column: usize,
}

impl Parser {
    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        token
    }

    fn peek_column(&self) -> usize {
        self.tokens
            .get(self.pos)
            .map_or(self.end_column, |t| t.column)
    }

    fn operator(&mut self, field: &str) -> Result<(CompareOp, usize), QueryError> {
        let column = self.peek_column();
        let op = match self.next().map(|t| t.kind) {
            Some(TokenKind::Op(op)) => op,
            Some(TokenKind::Word(w)) if w.eq_ignore_ascii_case("in") => CompareOp::In,
            Some(TokenKind::Word(w)) if w.eq_ignore_ascii_case("notin") => CompareOp::NotIn,
            _ => {
                return Err(err(
                    column,
                    QueryErrorKind::ExpectedOperator {
                        field: field.to_string(),
                    },
                ));
            }
        };
        Ok((op, column))
    }

    fn word(&mut self, field: Field) -> Result<(String, usize), QueryError> {
        let column = self.peek_column();
        match self.next().map(|t| t.kind) {
            Some(TokenKind::Word(w)) => Ok((w, column)),
            _ => Err(err(column, QueryErrorKind::ExpectedValue { field })),
        }
    }

    fn value(&mut self, field: Field) -> Result<Value, QueryError> {
        let (word, column) = self.word(field)?;
        parse_value(field, &word, column)
    }

    fn list(&mut self, field: Field) -> Result<Vec<Value>, QueryError> {
        let open = self.peek_column();
        if !matches!(self.next().map(|t| t.kind), Some(TokenKind::LBracket)) {
            return Err(err(open, QueryErrorKind::ExpectedList));
        }
        let mut values = Vec::new();
        loop {
            let column = self.peek_column();
            match self.next().map(|t| t.kind) {
                Some(TokenKind::RBracket) if values.is_empty() => {
                    return Err(err(open, QueryErrorKind::EmptyList));
                }
                Some(TokenKind::Word(w)) => {
                    if values.len() >= MAX_LIST_VALUES {
                        return Err(err(
                            column,
                            QueryErrorKind::TooMany {
                                what: "list values",
                                max: MAX_LIST_VALUES,
                            },
                        ));
                    }
                    values.push(parse_value(field, &w, column)?);
                }
                None => return Err(err(open, QueryErrorKind::UnterminatedList)),
                Some(_) => return Err(err(column, QueryErrorKind::ExpectedValue { field })),
            }
            let column = self.peek_column();
            match self.next().map(|t| t.kind) {
                Some(TokenKind::Comma) => continue,
                Some(TokenKind::RBracket) => return Ok(values),
                None => return Err(err(open, QueryErrorKind::UnterminatedList)),
                Some(_) => return Err(err(column, QueryErrorKind::UnterminatedList)),
            }
        }
    }

    fn order(&mut self) -> Result<Vec<Ordering>, QueryError> {
        let column = self.peek_column();
        if !matches!(
            self.next().map(|t| t.kind),
            Some(TokenKind::Op(CompareOp::Eq))
        ) {
            return Err(err(
                column,
                QueryErrorKind::ExpectedOperator {
                    field: "order".into(),
                },
            ));
        }
        let mut order = Vec::new();
        loop {
            let column = self.peek_column();
            let Some(TokenKind::Word(word)) = self.next().map(|t| t.kind) else {
                return Err(err(column, QueryErrorKind::ExpectedOrderKey));
            };
            let lower = word.to_ascii_lowercase();
            let (name, descending) = match lower.strip_suffix('-') {
                Some(n) => (n, true),
                None => (lower.strip_suffix('+').unwrap_or(&lower), false),
            };
            let key = OrderKey::ALL
                .iter()
                .find(|(_, n)| *n == name)
                .map(|(k, _)| *k)
                .ok_or_else(|| {
                    err(
                        column,
                        QueryErrorKind::UnknownOrderKey {
                            name: word.clone(),
                            suggestion: closest(name, OrderKey::ALL.iter().map(|(_, n)| *n)),
                        },
                    )
                })?;
            if order.len() >= OrderKey::ALL.len() {
                return Err(err(
                    column,
                    QueryErrorKind::TooMany {
                        what: "order keys",
                        max: OrderKey::ALL.len(),
                    },
                ));
            }
            order.push(Ordering { key, descending });
            if self
                .tokens
                .get(self.pos)
                .is_some_and(|t| t.kind == TokenKind::Comma)
            {
                self.pos += 1;
            } else {
                return Ok(order);
            }
        }
    }
}

fn bad(field: Field, value: &str, column: usize, expected: &'static str) -> QueryError {
    err(
        column,
        QueryErrorKind::BadValue {
            field,
            value: value.chars().take(64).collect(),
            expected,
        },
    )
}

/// Packs a version so that integer order is version order.
pub(crate) fn version_key(v: Version) -> u64 {
    (u64::from(v.major) << 32) | (u64::from(v.minor) << 16) | u64::from(v.patch)
}

/// A compute capability on the query scale.
pub(crate) fn cc_key(cc: ComputeCapability) -> u64 {
    u64::from(cc.major) * 100 + u64::from(cc.minor)
}

/// A tier on the query scale.
pub(crate) fn tier_key(tier: EvidenceTier) -> u64 {
    match tier {
        EvidenceTier::SelfReported => 0,
        EvidenceTier::Challenged => 1,
        EvidenceTier::CcAttested => 2,
    }
}

fn parse_value(field: Field, word: &str, column: usize) -> Result<Value, QueryError> {
    match field {
        Field::Gpu => GpuFamily::lookup(word).map(Value::Family).ok_or_else(|| {
            let lower = word.to_ascii_lowercase();
            let names = gpux_protocol::family::FAMILIES
                .iter()
                .flat_map(|f| std::iter::once(f.key).chain(f.aliases.iter().copied()));
            err(
                column,
                QueryErrorKind::UnknownGpu {
                    name: word.to_string(),
                    suggestion: closest(&lower, names),
                },
            )
        }),
        Field::Vram
        | Field::Count
        | Field::PcieGen
        | Field::Disk
        | Field::Stage
        | Field::Ram
        | Field::DiskSpeed
        | Field::InetUp
        | Field::InetDown
        | Field::Pull => word
            .parse::<u64>()
            .map(Value::Number)
            .map_err(|_| bad(field, word, column, "a whole number")),
        Field::Price => word
            .parse::<MicroCredits>()
            .map(|m| Value::Number(m.0))
            .map_err(|_| bad(field, word, column, "credits per GPU-hour, like 2.50")),
        Field::DiskPrice => word
            .parse::<MicroCredits>()
            .map(|m| Value::Number(m.0))
            .map_err(|_| bad(field, word, column, "credits per GiB-hour, like 0.01")),
        Field::Cc => match word.parse::<ComputeCapability>() {
            Ok(cc) if cc.minor < 100 => Ok(Value::Number(cc_key(cc))),
            _ => Err(bad(field, word, column, "a compute capability like 8.6")),
        },
        Field::Cpu => match word.parse::<MicroCredits>() {
            Ok(m) if m.0 % 1000 == 0 => Ok(Value::Number(m.0 / 1000)),
            _ => Err(bad(
                field,
                word,
                column,
                "CPU cores per GPU, like 8 or 2.5 (at most 3 decimals)",
            )),
        },
        Field::Reliability => match word.parse::<MicroCredits>() {
            Ok(m) if m.0 <= 1_000_000 && m.0 % 1000 == 0 => Ok(Value::Number(m.0 / 1000)),
            _ => Err(bad(
                field,
                word,
                column,
                "a number from 0 to 1 with at most 3 decimals",
            )),
        },
        Field::Tier => word
            .parse::<EvidenceTier>()
            .map(|t| Value::Number(tier_key(t)))
            .map_err(|_| {
                bad(
                    field,
                    word,
                    column,
                    "self-reported, challenged or cc-attested",
                )
            }),
        Field::Spot | Field::Mig => match word.to_ascii_lowercase().as_str() {
            "true" | "yes" | "1" => Ok(Value::Bool(true)),
            "false" | "no" | "0" => Ok(Value::Bool(false)),
            _ => Err(bad(field, word, column, "true or false")),
        },
        Field::Host => word
            .parse::<PublicKey>()
            .or_else(|_| word.parse::<PeerId>().map(|p| p.public_key()))
            .map(Value::Host)
            .map_err(|_| {
                bad(
                    field,
                    word,
                    column,
                    "a peer id or a 64-hex-digit public key",
                )
            }),
        Field::Driver | Field::Cuda => word
            .parse::<Version>()
            .map(|v| Value::Number(version_key(v)))
            .map_err(|_| bad(field, word, column, "a version like 550 or 12.4")),
        Field::Image if word.starts_with("sha256:") => {
            word.parse::<ImageDigest>().map(Value::Image).map_err(|_| {
                bad(
                    field,
                    word,
                    column,
                    "an image digest sha256:<64 hex digits>",
                )
            })
        }
        Field::Image => {
            let body = word.strip_suffix('*').unwrap_or(word);
            if (body.is_empty() && word == "*") || gpux_protocol::is_image_tag(body) {
                Ok(Value::ImageTag(word.to_string()))
            } else {
                Err(bad(
                    field,
                    word,
                    column,
                    "an image digest sha256:<64 hex digits>, a tag like pytorch:2.4, or a prefix like pytorch*",
                ))
            }
        }
        Field::Region => {
            let lower = word.to_ascii_lowercase();
            let ok = !lower.is_empty()
                && lower.len() <= 32
                && lower
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if ok {
                Ok(Value::Region(lower))
            } else {
                Err(bad(field, word, column, "a region like eu or us-east"))
            }
        }
    }
}
