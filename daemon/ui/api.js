// HTTP against the daemon that served this page: JSON requests with the token and client id,
// errors as HttpError (status, and the daemon's {error, code}), and the session list. The token
// lives in sessionStorage (this tab only) and only ever travels in the Authorization header.

import {
  HEADER_AUTHORIZATION, HEADER_CLIENT_ID, ROUTES, SESSION_SCOPE_THREAD,
} from "./protocol.js";

const TOKEN_KEY = "turnkeeper.viewer.token";
const LIST_PAGE = 500; // sessions a page (the most GET /sessions serves)
const LIST_MAX = 2000; // sessions the list shows at most (the newest created)

export class HttpError extends Error {
  constructor(status, body) {
    const code = body && typeof body.code === "string" ? body.code : null;
    const text = body && typeof body.error === "string" ? body.error : `HTTP ${status}`;
    super(code ? `${text} (${code})` : text);
    this.status = status;
    this.body = body;
    this.code = code;
  }
}

// A request that never reached an answer (network down, daemon stopped).
export class NetworkError extends Error {}

export const isAuthStatus = (s) => s === 401 || s === 403;
export const isMissingStatus = (s) => s === 404 || s === 410;
export const isAbort = (e) => Boolean(e) && e.name === "AbortError";

export class Api {
  constructor({ onUnauthorized = () => {} } = {}) {
    this.token = sessionStorage.getItem(TOKEN_KEY);
    this.onUnauthorized = onUnauthorized;
  }

  setToken(token) {
    this.token = token || null;
    if (this.token) sessionStorage.setItem(TOKEN_KEY, this.token);
    else sessionStorage.removeItem(TOKEN_KEY);
  }

  headers(extra = {}) {
    const headers = { ...extra };
    if (this.token) headers[HEADER_AUTHORIZATION] = `Bearer ${this.token}`;
    return headers;
  }

  async request(method, path, { body = undefined, clientId = null, signal = undefined,
    headers = {} } = {}) {
    const extra = { ...headers };
    if (body !== undefined) extra["Content-Type"] = "application/json";
    if (clientId) extra[HEADER_CLIENT_ID] = clientId;
    let response;
    try {
      response = await fetch(path, {
        method, headers: this.headers(extra), signal, cache: "no-store",
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (error) {
      if (isAbort(error)) throw error;
      throw new NetworkError(`cannot reach the daemon: ${error && error.message ? error.message : error}`);
    }
    let text;
    try {
      text = await response.text();
    } catch (error) {
      if (isAbort(error)) throw error;
      // The answer was cut after its head: the request did reach the daemon.
      throw new NetworkError(`the daemon's answer was cut: ${error && error.message ? error.message : error}`);
    }
    let parsed = null;
    if (text) {
      try { parsed = JSON.parse(text); } catch { parsed = { error: text }; }
    }
    if (!response.ok) {
      if (response.status === 401) this.onUnauthorized();
      throw new HttpError(response.status, parsed);
    }
    return parsed;
  }

  capabilities() {
    return this.request("GET", ROUTES.capabilities());
  }

  // The daemon's sessions, loaded or unloaded (GET /sessions, a page at a time, newest created
  // first, at most LIST_MAX), what the list shows of each (workspace, state, times, branch), and
  // from GET /daemon/status the default workspace and the approval mode.
  async listSessions() {
    const [status, sessions] = await Promise.all([
      this.request("GET", ROUTES.daemonStatus()), this.allSessions()]);
    const home = status.defaultWorkspace && typeof status.defaultWorkspace === "object"
      ? status.defaultWorkspace : null;
    return {
      sessions,
      defaultWorkspace: home ? home.workspaceCwd : null,
      defaultBranch: home ? home.gitBranch : null,
      approvalMode: typeof status.approvalMode === "string" ? status.approvalMode : null,
    };
  }

  async allSessions() {
    const out = [];
    let cursor = null;
    do {
      const query = new URLSearchParams({ limit: String(LIST_PAGE) });
      if (cursor) query.set("cursor", cursor);
      const page = await this.request("GET", `${ROUTES.sessions()}?${query}`);
      if (!page || !Array.isArray(page.sessions)) break;
      out.push(...page.sessions);
      cursor = page.hasMore && typeof page.nextCursor === "string" ? page.nextCursor : null;
    } while (cursor && out.length < LIST_MAX);
    return out;
  }

  createSession(cwd = null) {
    const body = { sessionScope: SESSION_SCOPE_THREAD };
    if (cwd) body.cwd = cwd;
    return this.request("POST", ROUTES.create(), { body });
  }

  closeSession(sessionId) {
    return this.request("DELETE", ROUTES.close(sessionId));
  }
}
