import { source, type DemoRepoSpec } from '../spec.js';

const T = 'tests/test_collections.py';

const collectionsModule = (refill: string): string =>
  source(String.raw`
"""LIFO stack and FIFO queue with a common EmptyError."""


class EmptyError(IndexError):
    """Raised when taking an item from an empty collection."""


class Stack:
    def __init__(self, items=()):
        self._items = list(items)

    def push(self, item):
        self._items.append(item)

    def pop(self):
        if not self._items:
            raise EmptyError("pop from empty stack")
        return self._items.pop()

    def peek(self):
        if not self._items:
            raise EmptyError("peek at empty stack")
        return self._items[-1]

    def __len__(self):
        return len(self._items)


class Queue:
    """FIFO queue made of two stacks: amortised O(1) enqueue and dequeue."""

    def __init__(self, items=()):
        self._inbox = list(items)
        self._outbox = []

    def enqueue(self, item):
        self._inbox.append(item)

    def dequeue(self):
        if not self._outbox:
            # Refill the outbox so that its top is the oldest item.
            ${refill}
            self._inbox = []
        if not self._outbox:
            raise EmptyError("dequeue from empty queue")
        return self._outbox.pop()

    def peek(self):
        if self._outbox:
            return self._outbox[-1]
        if self._inbox:
            return self._inbox[0]
        raise EmptyError("peek at empty queue")

    def __len__(self):
        return len(self._inbox) + len(self._outbox)
`);

const baseTests = source(String.raw`
import unittest

from stackq import EmptyError, Queue, Stack


class TestStack(unittest.TestCase):
    def test_push_pop_is_lifo(self):
        stack = Stack([1, 2])
        stack.push(3)
        self.assertEqual([stack.pop(), stack.pop(), stack.pop()], [3, 2, 1])

    def test_peek_does_not_remove(self):
        stack = Stack(["a"])
        self.assertEqual(stack.peek(), "a")
        self.assertEqual(len(stack), 1)

    def test_pop_empty_raises(self):
        with self.assertRaises(EmptyError):
            Stack().pop()


class TestQueue(unittest.TestCase):
    def test_single_item(self):
        queue = Queue()
        queue.enqueue("x")
        self.assertEqual(queue.dequeue(), "x")

    def test_len_counts_items(self):
        queue = Queue([1, 2, 3])
        self.assertEqual(len(queue), 3)

    def test_peek_returns_oldest(self):
        self.assertEqual(Queue([1, 2]).peek(), 1)

    def test_dequeue_empty_raises(self):
        with self.assertRaises(EmptyError):
            Queue().dequeue()
`);

const newTests = source(String.raw`

    def test_fifo_order(self):
        queue = Queue([1, 2, 3])
        self.assertEqual([queue.dequeue() for _ in range(3)], [1, 2, 3])

    def test_interleaved_operations(self):
        queue = Queue()
        queue.enqueue(1)
        queue.enqueue(2)
        self.assertEqual(queue.dequeue(), 1)
        queue.enqueue(3)
        self.assertEqual([queue.dequeue(), queue.dequeue()], [2, 3])
`);

export const stackq: DemoRepoSpec = {
  name: 'stackq',
  repo: 'minisandbox-demo/stackq',
  instanceId: 'minisandbox-demo__stackq-3',
  version: '2.0',
  sourceRoot: '.',
  packages: ['stackq'],
  problemStatement: source(`
Queue.dequeue() returns items in LIFO order

    >>> q = stackq.Queue([1, 2, 3])
    >>> q.dequeue()
    3

A queue must be FIFO: the first dequeue() should return 1. Queue.peek()
already reports 1, so peek() and dequeue() disagree.
`),
  baseFiles: {
    'README.md': '# stackq\n\nStack and queue data structures.\n',
    'stackq/__init__.py': source(`
"""stackq: stack and queue data structures."""
from .collections import EmptyError, Queue, Stack

__all__ = ["EmptyError", "Queue", "Stack"]
`),
    'stackq/collections.py': collectionsModule('self._outbox = self._inbox'),
    // A package, so the suite also runs as "python -m unittest tests.test_collections".
    'tests/__init__.py': '',
    [T]: baseTests,
  },
  fixFiles: { 'stackq/collections.py': collectionsModule('self._outbox = self._inbox[::-1]') },
  testFiles: { [T]: baseTests + newTests },
  testPaths: [T],
  FAIL_TO_PASS: [`${T}::TestQueue::test_fifo_order`, `${T}::TestQueue::test_interleaved_operations`],
  PASS_TO_PASS: [
    `${T}::TestStack::test_push_pop_is_lifo`,
    `${T}::TestStack::test_peek_does_not_remove`,
    `${T}::TestStack::test_pop_empty_raises`,
    `${T}::TestQueue::test_single_item`,
    `${T}::TestQueue::test_len_counts_items`,
    `${T}::TestQueue::test_peek_returns_oldest`,
    `${T}::TestQueue::test_dequeue_empty_raises`,
  ],
};
