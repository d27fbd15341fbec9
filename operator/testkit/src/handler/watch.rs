//! Watch requests (start point, bookmarks, initial events, timeout, injected
//! cuts) and the pod `log` subresource (`container`, `tailLines`, `follow`).

use std::time::Duration;

use http::{Response, header};

use super::{Ctx, Resp, list::parse_rv, response::text_response};
use crate::{
    error::ApiError,
    kubelet::logs,
    resources::ResourceType,
    route::Target,
    selector::{FieldSelector, LabelSelector},
    watch::{self, Start, WatchParams},
};

impl Ctx {
    pub(super) fn watch(
        &self,
        rt: ResourceType,
        t: &Target,
        cut_after: Option<(usize, crate::faults::WatchCut)>,
    ) -> Result<Resp, ApiError> {
        let labels = LabelSelector::parse(self.query.get("labelSelector").unwrap_or(""))?;
        let fields = FieldSelector::parse(self.query.get("fieldSelector").unwrap_or(""))?;
        let send_initial_events = self.query.flag("sendInitialEvents");
        let start = match self.query.get("resourceVersion") {
            None | Some("0") => Start::Initial,
            Some(_) if send_initial_events => Start::Initial,
            Some(rv) => Start::After(parse_rv(rv)?),
        };
        if send_initial_events && !self.query.flag("allowWatchBookmarks") {
            return Err(ApiError::invalid(
                &rt,
                "",
                vec![crate::error::Cause {
                    reason: "FieldValueForbidden".to_owned(),
                    message:
                        "Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true"
                            .to_owned(),
                    field: "allowWatchBookmarks".to_owned(),
                }],
            ));
        }
        let timeout = self
            .query
            .get("timeoutSeconds")
            .and_then(|s| s.parse::<u64>().ok())
            .map(Duration::from_secs)
            .unwrap_or(self.shared.config.default_watch_timeout);
        let params = WatchParams {
            start,
            bookmarks: self.query.flag("allowWatchBookmarks"),
            send_initial_events,
            timeout,
            namespace: t.namespace.clone(),
            labels,
            fields,
            version: t.version.clone(),
            metadata_only: self.metadata_only(),
            cut_after,
        };
        let body = watch::spawn(self.shared.clone(), rt, params);
        let mut resp = Response::new(body);
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        Ok(resp)
    }

    pub(super) fn pod_log(&self, t: &Target) -> Result<Resp, ApiError> {
        let ns = t.namespace.clone().unwrap_or_default();
        let name = t.name.clone().unwrap_or_default();
        let container = self.query.get("container").map(str::to_owned);
        let tail = self
            .query
            .get("tailLines")
            .and_then(|n| n.parse::<usize>().ok());
        if self.query.flag("follow") {
            let (path, container) = self.shared.pod_log_path(&ns, &name, container.as_deref())?;
            let body = logs::follow(self.shared.clone(), ns, name, container, path);
            let mut resp = Response::new(body);
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("text/plain"),
            );
            return Ok(resp);
        }
        let text = self.shared.pod_log(&ns, &name, container.as_deref())?;
        Ok(text_response(logs::tail(&text, tail)))
    }
}
