// The gauge a draining server shows on its /metrics, for an endpoint picker that scrapes it: a
// gateway told to stop says so here as soon as it drains, within one scrape (50 ms for ours),
// which is sooner than a picker that follows pods may see the pod go.

/** 1 while the server drains (takes no new request), else 0. */
export const DRAINING_GAUGE = "airm_draining";
