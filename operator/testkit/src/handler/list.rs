//! List requests: selectors, the list resourceVersion rules, and pagination
//! with `limit` and opaque `continue` tokens.

use serde_json::{Value, json};

use super::{
    Ctx, Resp,
    response::{json_response, present},
};
use crate::{
    error::ApiError,
    resources::ResourceType,
    route::Target,
    selector::{FieldSelector, LabelSelector},
};

pub(super) fn parse_rv(rv: &str) -> Result<u64, ApiError> {
    rv.parse::<u64>()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv:?}")))
}

fn encode_continue(rv: u64, last: &str) -> String {
    format!("{rv}:{last}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_continue(token: &str) -> Result<(u64, String), ApiError> {
    let bad = || ApiError::bad_request("continue key is not valid: invalid continue token");
    if !token.len().is_multiple_of(2) {
        return Err(bad());
    }
    let bytes: Result<Vec<u8>, _> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2).unwrap_or("zz"), 16))
        .collect();
    let text = String::from_utf8(bytes.map_err(|_| bad())?).map_err(|_| bad())?;
    let (rv, last) = text.split_once(':').ok_or_else(bad)?;
    Ok((rv.parse().map_err(|_| bad())?, last.to_owned()))
}

impl Ctx {
    pub(super) fn list_json(
        &self,
        rt: &ResourceType,
        t: &Target,
        items: Vec<Value>,
        rv: u64,
        cont: Option<(String, usize)>,
    ) -> Value {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if let Some((token, remaining)) = cont {
            meta["continue"] = json!(token);
            meta["remainingItemCount"] = json!(remaining);
        }
        let (api_version, kind) = if self.metadata_only() {
            (
                "meta.k8s.io/v1".to_owned(),
                "PartialObjectMetadataList".to_owned(),
            )
        } else {
            (rt.api_version(&t.version), format!("{}List", rt.kind))
        };
        json!({
            "apiVersion": api_version,
            "kind": kind,
            "metadata": meta,
            "items": items,
        })
    }

    pub(super) fn list(&self, rt: &ResourceType, t: &Target) -> Result<Resp, ApiError> {
        let labels = LabelSelector::parse(self.query.get("labelSelector").unwrap_or(""))?;
        let fields = FieldSelector::parse(self.query.get("fieldSelector").unwrap_or(""))?;
        let state = self.shared.lock();
        let current = state.resource_version();
        if let Some(rv) = self.query.get("resourceVersion").filter(|rv| *rv != "0") {
            let rv = parse_rv(rv)?;
            match self.query.get("resourceVersionMatch") {
                Some("Exact") if rv != current => {
                    return Err(ApiError::expired(format!(
                        "too old resource version: {rv} ({current}); testkit only serves exact lists at the latest resourceVersion"
                    )));
                }
                _ if rv > current => {
                    return Err(ApiError::new(
                        504,
                        "Timeout",
                        format!("Too large resource version: {rv}, current: {current}"),
                    )
                    .with_causes(vec![crate::error::Cause {
                        reason: "ResourceVersionTooLarge".to_owned(),
                        message: "Too large resource version".to_owned(),
                        field: String::new(),
                    }]));
                }
                _ => {}
            }
        }
        let (items, rv) = state.list(rt, t.namespace.as_deref(), &labels, &fields);
        drop(state);
        let (list_rv, after) = match self.query.get("continue") {
            Some(token) => {
                let (rv, last) = decode_continue(token)?;
                if rv < self.shared.lock().compacted_rv() {
                    return Err(ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                    ));
                }
                (rv, Some(last))
            }
            None => (rv, None),
        };
        let mut items: Vec<(String, Value)> = items
            .into_iter()
            .map(|(k, v)| (format!("{}/{}", k.namespace, k.name), v))
            .filter(|(k, _)| after.as_ref().is_none_or(|a| k > a))
            .collect();
        let limit = self
            .query
            .get("limit")
            .and_then(|l| l.parse::<usize>().ok())
            .filter(|l| *l > 0);
        let mut cont = None;
        if let Some(limit) = limit
            && items.len() > limit
        {
            let remaining = items.len() - limit;
            items.truncate(limit);
            if let Some((last, _)) = items.last() {
                cont = Some((encode_continue(list_rv, last), remaining));
            }
        }
        let items = items
            .into_iter()
            .map(|(_, v)| present(rt, &t.version, &v, self.metadata_only()))
            .collect();
        Ok(json_response(
            200,
            &self.list_json(rt, t, items, list_rv, cont),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip() {
        let t = encode_continue(42, "ns/name-1");
        assert_eq!(decode_continue(&t).unwrap(), (42, "ns/name-1".to_owned()));
        assert_eq!(decode_continue("zz").unwrap_err().code, 400);
    }
}
