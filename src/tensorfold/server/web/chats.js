// Several conversations in this browser: the open one in its own key (as the page always kept
// it), the others in a list, most recent first, each with an id and a title from its first turn.
"use strict";

const chats = (() => {
  const LIST = "tensorfold.chats.v1";
  const OPEN_ID = "tensorfold.chat.id";

  function read(name, fallback) {
    try {
      return JSON.parse(localStorage.getItem(name)) ?? fallback;
    } catch {
      return fallback;
    }
  }

  const newId = () => `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`;

  function title(messages) {
    const first = messages.find((m) => m.role === "user")?.content || "(empty)";
    return first.length > 48 ? `${first.slice(0, 47)}…` : first;
  }

  function list() {
    return read(LIST, []);
  }

  function openId() {
    let id = localStorage.getItem(OPEN_ID);
    if (!id) localStorage.setItem(OPEN_ID, (id = newId()));
    return id;
  }

  // The open conversation goes to the top of the list (when it has turns); `next` is opened:
  // an id from the list (taken out of it), or null for a new, empty one. Returns its messages.
  function switchTo(messages, next) {
    let others = list().filter((c) => c.id !== openId());
    if (messages.length) others.unshift({ id: openId(), title: title(messages), messages });
    const chosen = others.find((c) => c.id === next);
    others = others.filter((c) => c.id !== next);
    localStorage.setItem(LIST, JSON.stringify(others));
    localStorage.setItem(OPEN_ID, chosen ? chosen.id : newId());
    return chosen ? chosen.messages : [];
  }

  function remove(id) {
    localStorage.setItem(LIST, JSON.stringify(list().filter((c) => c.id !== id)));
  }

  return { list, switchTo, remove };
})();
