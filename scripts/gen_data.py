"""Generates the data shipped in specs/data/ (see specs/data/README.md): procedurally made
math problems whose answers SymPy computes, each checked against an independent
brute-force computation, a knowledge base of short passages, and a hard split for SOAR.

    .venv/bin/python scripts/gen_data.py            # rewrites the files (seed 0)
    .venv/bin/python scripts/gen_data.py --check    # exit 1 if a shipped file differs

The output depends only on the seed: tests/specs/test_shipped_data.py regenerates the
files and compares them byte for byte, then checks every answer with math-verify.
Nothing here downloads anything; no text comes from a third party."""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from fractions import Fraction
from itertools import permutations, product
from pathlib import Path

import sympy as sp

SEED = 0
DATA = Path(__file__).resolve().parents[1] / "specs" / "data"
MATH_FILE, HARD_FILE, PASSAGES_FILE = "math_problems.jsonl", "soar_hard.jsonl", "passages.jsonl"
N_MATH, N_HARD = 300, 120
HARD_TEST_SHARE = 0.25  # SOAR holds out a test split of the hard set (soar.txt §4)
# the last 60 math problems are held out (`split: test`): the evaluation stages' data
# (Ask-E's downstream pass@8 / avg@8, Reasoning Arena's pass ratio@16); the templates are
# drawn round robin, so the tail covers every template whose distinct problems last that long
# (all but the 8 word arrangements)
MATH_TEST = 60

x = sp.Symbol("x")


def _ans(v) -> str:
    """An answer as math-verify reads it: integers plain, rationals as p/q."""
    v = sp.nsimplify(v)
    if v.is_Integer:
        return str(int(v))
    if v.is_Rational:
        return f"{v.p}/{v.q}"
    return sp.latex(v)


def _agree(a, b) -> None:
    if sp.simplify(sp.nsimplify(a) - sp.nsimplify(b)) != 0:
        raise AssertionError(f"sympy {a} != brute force {b}")


# ------------------------------------------------------------------ standard templates
# each: rng -> (question, sympy answer, brute-force answer)

def t_linear(r):
    a, s, b = r.randint(2, 12), r.randint(-20, 20), r.randint(-30, 30)
    c = a * s + b
    sol = sp.solve(sp.Eq(a * x + b, c), x)[0]
    return f"Solve for x: {a}x + {b} = {c}.".replace("+ -", "- "), sol, next(v for v in range(-50, 51) if a * v + b == c)


def t_divisor_sum(r):
    n = r.randint(12, 400)
    return f"What is the sum of all positive divisors of {n}?", sp.divisor_sigma(n), sum(d for d in range(1, n + 1) if n % d == 0)


def t_divisor_count(r):
    n = r.randint(12, 1000)
    return f"How many positive divisors does {n} have?", sp.divisor_count(n), sum(1 for d in range(1, n + 1) if n % d == 0)


def t_powmod(r):
    a, b, m = r.randint(2, 19), r.randint(20, 200), r.randint(3, 13)
    return f"Find the remainder when {a}^{b} is divided by {m}.", sp.Mod(sp.Integer(a) ** b, m), pow(a, b, m)


def t_gcd_lcm(r):
    a, b = r.randint(12, 300), r.randint(12, 300)
    if r.random() < 0.5:
        return f"What is the greatest common divisor of {a} and {b}?", sp.gcd(a, b), max(d for d in range(1, min(a, b) + 1) if a % d == 0 == b % d)
    return f"What is the least common multiple of {a} and {b}?", sp.lcm(a, b), next(m for m in range(max(a, b), a * b + 1) if m % a == 0 == m % b)


def t_binomial(r):
    n = r.randint(5, 15)
    k = r.randint(2, n - 2)
    return (f"In how many ways can a committee of {k} be chosen from {n} people?", sp.binomial(n, k),
            sum(1 for bits in range(1 << n) if bin(bits).count("1") == k))


def t_word(r):
    word = r.choice(["LEVEL", "BANANA", "COOKIE", "LETTER", "SCHOOL", "PEPPER", "ATTIC", "MAMMAL"])
    counts = [word.count(c) for c in sorted(set(word))]
    formula = sp.factorial(len(word)) / sp.prod([sp.factorial(c) for c in counts])
    return (f"How many distinct arrangements of the letters of the word {word} are there?", formula,
            len(set(permutations(word))))


def t_series(r):
    a, d, n = r.randint(-10, 20), r.randint(1, 9), r.randint(5, 40)
    k = sp.Symbol("k")
    return (f"What is the sum of the first {n} terms of the arithmetic sequence that starts {a}, {a + d}, {a + 2 * d}, ...?",
            sp.summation(a + k * d, (k, 0, n - 1)), sum(a + i * d for i in range(n)))


def t_quadratic(r):
    p, q = r.randint(-12, 12), r.randint(-12, 12)
    poly = sp.expand((x - p) * (x - q))
    roots = sp.solve(poly, x)
    which = r.choice(["sum", "product", "larger"])
    text = sp.sstr(poly).replace("**", "^").replace("*", "")
    if which == "sum":
        return f"What is the sum of the roots of {text} = 0?", sum(roots) if len(roots) == 2 else 2 * roots[0], p + q
    if which == "product":
        return f"What is the product of the roots of {text} = 0?", sp.prod(roots) if len(roots) == 2 else roots[0] ** 2, p * q
    return f"What is the larger root of {text} = 0?", max(roots), max(p, q)


def t_fraction(r):
    a, b, c, d = r.randint(1, 9), r.randint(2, 12), r.randint(1, 9), r.randint(2, 12)
    return (f"Compute {a}/{b} + {c}/{d} and give the answer as a fraction in lowest terms.",
            sp.Rational(a, b) + sp.Rational(c, d), Fraction(a, b) + Fraction(c, d))


def t_dice(r):
    s = r.randint(3, 11)
    return (f"Two fair six-sided dice are rolled. What is the probability that the sum is {s}? Give a fraction.",
            sp.Rational(sum(1 for i in range(1, 7) for j in range(1, 7) if i + j == s), 36),
            Fraction(sum(1 for i, j in product(range(1, 7), repeat=2) if i + j == s), 36))


def t_derivative(r):
    a, b, c, n, at = r.randint(1, 5), r.randint(-6, 6), r.randint(-9, 9), r.randint(2, 4), r.randint(-3, 3)
    f = a * x ** n + b * x + c
    text = sp.sstr(f).replace("**", "^").replace("*", "")
    return (f"Let f(x) = {text}. What is f'({at})?", sp.diff(f, x).subs(x, at), a * n * at ** (n - 1) + b)


def t_integral(r):
    a, b, hi = r.randint(1, 6), r.randint(-5, 5), r.randint(1, 4)
    f = a * x ** 2 + b * x
    text = sp.sstr(f).replace("**", "^").replace("*", "")
    return (f"Compute the definite integral of {text} from x = 0 to x = {hi}.", sp.integrate(f, (x, 0, hi)),
            Fraction(a * hi ** 3, 3) + Fraction(b * hi ** 2, 2))


def t_triangle(r):
    pts = [(r.randint(-8, 8), r.randint(-8, 8)) for _ in range(3)]
    (x1, y1), (x2, y2), (x3, y3) = pts
    area = abs(sp.Matrix([[x1, y1, 1], [x2, y2, 1], [x3, y3, 1]]).det()) / 2
    if area == 0:
        return t_triangle(r)
    shoelace = Fraction(abs(x1 * (y2 - y3) + x2 * (y3 - y1) + x3 * (y1 - y2)), 2)
    return (f"What is the area of the triangle with vertices ({x1}, {y1}), ({x2}, {y2}) and ({x3}, {y3})?", area, shoelace)


STANDARD = [t_linear, t_divisor_sum, t_divisor_count, t_powmod, t_gcd_lcm, t_binomial, t_word, t_series,
            t_quadratic, t_fraction, t_dice, t_derivative, t_integral, t_triangle]


# ------------------------------------------------------------------ hard templates (multi-step)

def h_incl_excl(r):
    n, a, b, c = r.randint(500, 3000), r.randint(3, 9), r.randint(4, 13), r.randint(5, 17)
    if len({a, b, c}) < 3:
        return h_incl_excl(r)
    brute = sum(1 for k in range(1, n + 1) if (k % a == 0 or k % b == 0) and k % c != 0)
    l = sp.lcm
    formula = (n // a + n // b - n // l(a, b)) - (n // l(a, c) + n // l(b, c) - n // l(l(a, b), c))
    return f"How many integers from 1 to {n} are divisible by {a} or {b} but not by {c}?", formula, brute


def h_last_digits(r):
    a, b = r.randint(3, 97), r.randint(100, 2000)
    return f"What are the last three digits of {a}^{b}? Give them as a number from 0 to 999.", sp.Mod(sp.Integer(a) ** b, 1000), pow(a, b, 1000)


def h_crt(r):
    mods = r.sample([3, 4, 5, 7, 9, 11, 13], 3)
    if any(math.gcd(p, q) > 1 for p in mods for q in mods if p != q):
        return h_crt(r)
    res = [r.randint(0, m - 1) for m in mods]
    from sympy.ntheory.modular import crt
    sol = crt(mods, res)[0]
    brute = next(n for n in range(1, math.prod(mods) + 1) if all(n % m == v for m, v in zip(mods, res)))
    if sol == 0:
        sol = math.prod(mods)
    conds = ", ".join(f"a remainder of {v} when divided by {m}" for m, v in zip(mods, res))
    return f"What is the smallest positive integer that leaves {conds}?", sol, brute


def h_digit_sum_pow(r):
    k = r.randint(20, 120)
    return f"What is the sum of the digits of 2^{k}?", sum(int(d) for d in str(sp.Integer(2) ** k)), sum(map(int, str(2 ** k)))


def h_trailing_zeros(r):
    n = r.randint(50, 2000)
    formula = sum(n // 5 ** i for i in range(1, 6))
    f, zeros = math.factorial(n), 0
    while f % 10 == 0:  # counted by division: str() of a 5,000-digit number is refused
        f, zeros = f // 10, zeros + 1
    return f"How many zeros does {n}! end with?", formula, zeros


def h_coefficient(r):
    a, n = r.randint(2, 5), r.randint(5, 10)
    k = r.randint(2, n - 1)
    coeff = sp.Poly(sp.expand((1 + a * x) ** n), x).coeff_monomial(x ** k)
    return f"What is the coefficient of x^{k} in the expansion of (1 + {a}x)^{n}?", coeff, math.comb(n, k) * a ** k


def h_bounded_solutions(r):
    cap = r.randint(4, 12)
    n = r.randint(cap, 3 * cap - 1)  # some triple reaches n, and not trivially few
    brute = sum(1 for a in range(cap + 1) for b in range(cap + 1) if 0 <= n - a - b <= cap)
    # inclusion-exclusion over variables exceeding the cap
    formula = sum((-1) ** j * sp.binomial(3, j) * sp.binomial(n - j * (cap + 1) + 2, 2)
                  for j in range(4) if n - j * (cap + 1) >= 0)
    return (f"How many ordered triples (a, b, c) of integers with 0 <= a, b, c <= {cap} satisfy a + b + c = {n}?",
            formula, brute)


def h_coprime_sum(r):
    m, n = r.randint(6, 60), r.randint(100, 600)
    brute = sum(k for k in range(1, n + 1) if math.gcd(k, m) == 1)
    ps = sp.primefactors(m)
    formula = 0
    for mask in range(1 << len(ps)):
        d = sp.prod([p for i, p in enumerate(ps) if mask >> i & 1])
        t = n // d
        formula += (-1) ** bin(mask).count("1") * d * (t * (t + 1) // 2)
    return f"What is the sum of all integers from 1 to {n} that are relatively prime to {m}?", formula, brute


HARD = [h_incl_excl, h_last_digits, h_crt, h_digit_sum_pow, h_trailing_zeros, h_coefficient, h_bounded_solutions,
        h_coprime_sum]


def problems(templates, n: int, rng: random.Random, prefix: str) -> list[dict]:
    out, seen, tries = [], set(), 0
    while len(out) < n:
        t = templates[tries % len(templates)]  # round robin over templates; a repeat is skipped
        tries += 1
        if tries > 50 * n:
            raise RuntimeError("the templates cannot make that many distinct problems")
        question, exact, brute = t(rng)
        if question in seen:
            continue
        _agree(exact, brute)
        seen.add(question)
        out.append({"id": f"{prefix}{len(out) + 1:03d}", "template": t.__name__, "question": question,
                    "answer": _ans(exact), "_brute": str(brute)})
    return out


# ------------------------------------------------------------------ knowledge passages
# Short passages written for askspec (no third-party text), one fact each with a worked example.

PASSAGES = [
    "The sum of the interior angles of a convex polygon with n sides is (n - 2) * 180 degrees. Each interior angle of a regular n-gon is therefore (n - 2) * 180 / n degrees; a regular hexagon has angles of 120 degrees.",
    "An arithmetic sequence has a constant difference d between consecutive terms. Its n-th term is a_1 + (n - 1) d and the sum of its first n terms is n (a_1 + a_n) / 2. The sum 1 + 2 + ... + 100 is 5050.",
    "A geometric sequence multiplies each term by a constant ratio r. The sum of its first n terms is a_1 (r^n - 1) / (r - 1) when r is not 1. For example 1 + 2 + 4 + ... + 2^9 = 1023.",
    "The number of ways to choose k objects from n distinct objects, ignoring order, is C(n, k) = n! / (k! (n - k)!). A committee of 3 can be chosen from 7 people in 35 ways.",
    "The number of ordered arrangements of k objects chosen from n distinct objects is n! / (n - k)!. Gold, silver and bronze can be awarded among 8 runners in 336 ways.",
    "The arrangements of a word with repeated letters are counted by dividing n! by the factorial of each letter's multiplicity. The word BOOK has 4! / 2! = 12 arrangements.",
    "Stars and bars: the number of ways to write n as an ordered sum of k non-negative integers is C(n + k - 1, k - 1). There are C(7, 2) = 21 solutions of a + b + c = 5 in non-negative integers.",
    "The inclusion-exclusion principle counts a union: |A or B| = |A| + |B| - |A and B|. Among 1 to 100, 50 numbers are even, 33 are multiples of 3 and 16 are multiples of 6, so 67 are multiples of 2 or 3.",
    "The greatest common divisor of two integers can be found by the Euclidean algorithm: gcd(a, b) = gcd(b, a mod b). For example gcd(84, 36) = gcd(36, 12) = 12. The product of the gcd and the lcm of two positive integers equals their product.",
    "If n = p1^a1 * p2^a2 * ... * pk^ak is the prime factorisation of n, then n has (a1 + 1)(a2 + 1)...(ak + 1) positive divisors. Since 72 = 2^3 * 3^2, it has 4 * 3 = 12 divisors.",
    "The sum of the divisors of p^a is (p^(a+1) - 1) / (p - 1), and the divisor sum is multiplicative. The divisors of 12 = 2^2 * 3 sum to 7 * 4 = 28.",
    "Fermat's little theorem: if p is prime and p does not divide a, then a^(p-1) leaves remainder 1 when divided by p. So 3^6 leaves remainder 1 when divided by 7, and 3^100 = 3^(6*16+4) leaves the same remainder as 3^4 = 81, which is 4.",
    "Euler's totient phi(n) counts the integers from 1 to n that are relatively prime to n. For n = p1^a1 ... pk^ak, phi(n) = n (1 - 1/p1) ... (1 - 1/pk). For example phi(36) = 36 * 1/2 * 2/3 = 12.",
    "The Chinese remainder theorem says that congruences modulo pairwise coprime moduli have a unique solution modulo their product. The smallest positive n with n = 2 mod 3 and n = 3 mod 5 is 8.",
    "The last digit of a power repeats with a short period. Powers of 7 end in 7, 9, 3, 1 and then repeat, so 7^2023 ends in the same digit as 7^3, namely 3.",
    "The number of trailing zeros of n! equals the number of factors 5 in n!, which is floor(n/5) + floor(n/25) + floor(n/125) + .... So 100! ends with 20 + 4 = 24 zeros.",
    "For a quadratic ax^2 + bx + c = 0, the roots are (-b +/- sqrt(b^2 - 4ac)) / (2a). Vieta's formulas give the sum of the roots -b/a and the product c/a; for x^2 - 5x + 6 the roots 2 and 3 sum to 5 and multiply to 6.",
    "The discriminant b^2 - 4ac of a quadratic decides its real roots: positive means two, zero means one repeated root, negative means none. The equation x^2 + 2x + 5 = 0 has discriminant -16 and no real roots.",
    "The binomial theorem: (a + b)^n is the sum over k of C(n, k) a^(n-k) b^k. The coefficient of x^2 in (1 + 2x)^5 is C(5, 2) * 2^2 = 40.",
    "The probability of an event with equally likely outcomes is the number of favourable outcomes divided by the number of outcomes. Two dice show a sum of 7 in 6 of 36 cases, a probability of 1/6.",
    "For independent events the probability that both happen is the product of their probabilities. The probability of two heads in two fair coin tosses is 1/2 * 1/2 = 1/4, and of at least one head is 1 - 1/4 = 3/4.",
    "The expected value of a random variable is the probability-weighted average of its values. A fair six-sided die has expected value (1 + 2 + ... + 6) / 6 = 3.5.",
    "The area of a triangle with vertices (x1, y1), (x2, y2), (x3, y3) is |x1(y2 - y3) + x2(y3 - y1) + x3(y1 - y2)| / 2 (the shoelace formula). The triangle (0, 0), (4, 0), (0, 3) has area 6.",
    "Heron's formula gives a triangle's area from its sides a, b, c: with s = (a + b + c) / 2, the area is sqrt(s (s - a)(s - b)(s - c)). The 13-14-15 triangle has s = 21 and area 84.",
    "The Pythagorean theorem: in a right triangle with legs a, b and hypotenuse c, a^2 + b^2 = c^2. The triple 5, 12, 13 satisfies 25 + 144 = 169.",
    "A circle of radius r has circumference 2 pi r and area pi r^2. An inscribed angle is half the central angle that subtends the same arc, so an angle inscribed in a semicircle is a right angle.",
    "The distance between points (x1, y1) and (x2, y2) is sqrt((x2 - x1)^2 + (y2 - y1)^2). The distance from (1, 2) to (4, 6) is sqrt(9 + 16) = 5.",
    "The derivative of x^n is n x^(n-1), and differentiation is linear. For f(x) = 3x^4 - 2x + 1, f'(x) = 12x^3 - 2 and f'(1) = 10.",
    "The definite integral of x^n from 0 to b is b^(n+1) / (n + 1) for n not equal to -1. The integral of 3x^2 + 2x from 0 to 2 is 8 + 4 = 12.",
    "A function has a local extremum where its derivative changes sign. The function x^2 - 6x + 11 has derivative 2x - 6, zero at x = 3, where it takes its minimum value 2.",
    "Logarithms turn products into sums: log(ab) = log a + log b and log(a^k) = k log a. Since 2^10 = 1024, log base 2 of 1024 is 10.",
    "The arithmetic mean of non-negative numbers is at least their geometric mean: (a + b) / 2 >= sqrt(ab), with equality when a = b. Hence x + 1/x >= 2 for x > 0.",
    "A number is divisible by 3 exactly when the sum of its digits is, and by 9 exactly when the digit sum is divisible by 9. The number 7,425 has digit sum 18, so it is divisible by 9.",
    "In base b a numeral d_k ... d_1 d_0 stands for d_k b^k + ... + d_1 b + d_0. The binary numeral 101101 is 32 + 8 + 4 + 1 = 45.",
    "The pigeonhole principle: if n + 1 objects go into n boxes, some box holds at least two. Among any 13 people, two share a birth month.",
    "A linear equation ax + b = c has the single solution x = (c - b) / a when a is not 0. The equation 4x + 7 = 31 gives x = 6.",
    "Two lines y = m1 x + c1 and y = m2 x + c2 are parallel when m1 = m2 and perpendicular when m1 m2 = -1. The lines y = 2x + 1 and y = -x/2 + 3 are perpendicular.",
    "The recursion F(n) = F(n - 1) + F(n - 2) with F(1) = F(2) = 1 gives the Fibonacci numbers 1, 1, 2, 3, 5, 8, 13, 21. The number of ways to climb n stairs taking one or two steps at a time is F(n + 1).",
    "Modular arithmetic respects sums and products: the remainder of a product is the remainder of the product of remainders. The remainder of 123 * 456 divided by 7 equals that of 4 * 1 = 4.",
    "A prime number has exactly two positive divisors. To test n for primality it is enough to try divisors up to sqrt(n); 97 is prime because none of 2, 3, 5, 7 divides it.",
]


# ------------------------------------------------------------------ PasoDoble cold start
# PasoDoble App. A: before RL, both roles are fine-tuned on examples of their output format.
# The paper's records come from a larger model and are filtered by answer agreement; ours
# are procedural: a problem on one passage's topic, a worked solution written from the same
# numbers, and the answer computed by SymPy and checked against a brute-force computation.
# Each template: rng -> (question, worked solution, check sentence, sympy answer, brute force).

def _sign(v: int) -> str:
    return f"- {-v}" if v < 0 else f"+ {v}"


def c_linear(r):
    a, s, b = r.randint(2, 12), r.randint(-20, 20), r.choice([v for v in range(-30, 31) if v])
    c = a * s + b
    q = f"A number x satisfies {a}x {_sign(b)} = {c}. What is x?"
    sol = (f"Move the constant to the right-hand side: {a}x = {c} {_sign(-b)} = {c - b}. "
           f"Divide both sides by {a}: x = {c - b} / {a} = {s}.")
    return q, sol, f"Check: {a} * ({s}) {_sign(b)} = {c}.", sp.Rational(c - b, a), next(v for v in range(-50, 51) if a * v + b == c)


def c_series(r):
    a, d, n = r.randint(-10, 20), r.randint(1, 9), r.randint(5, 40)
    last = a + (n - 1) * d
    q = f"An arithmetic sequence starts {a}, {a + d}, {a + 2 * d}, ... What is the sum of its first {n} terms?"
    sol = (f"The common difference is d = {d}. Term number {n} is a_1 + (n - 1) d = {a} + {n - 1} * {d} = {last}. "
           f"The sum of the first {n} terms is n (a_1 + a_n) / 2 = {n} * ({a} + {last}) / 2 = {n * (a + last) // 2}.")
    return (q, sol, f"Check: the average term ({a} + {last}) / 2 times {n} terms gives the same sum.",
            sp.Rational(n * (a + last), 2), sum(a + i * d for i in range(n)))


def c_binomial(r):
    n = r.randint(5, 15)
    k = r.randint(2, n - 2)
    top = " * ".join(str(n - i) for i in range(k))
    num = math.prod(n - i for i in range(k))
    q = f"A club has {n} members. In how many ways can it choose a committee of {k} members?"
    sol = (f"The order of the members does not matter, so the count is C({n}, {k}) = {n}! / ({k}! {n - k}!) "
           f"= ({top}) / {k}! = {num} / {math.factorial(k)} = {num // math.factorial(k)}.")
    return (q, sol, f"Check: C({n}, {k}) = C({n}, {n - k}), the committees of the members left out.", sp.binomial(n, k),
            sum(1 for bits in range(1 << n) if bin(bits).count("1") == k))


def c_word(r):
    word = r.choice(["LEVEL", "BANANA", "COOKIE", "LETTER", "SCHOOL", "PEPPER", "ATTIC", "MAMMAL", "COFFEE", "GOOGLE"])
    counts = {c: word.count(c) for c in sorted(set(word))}
    repeated = {c: m for c, m in counts.items() if m > 1}
    den = math.prod(math.factorial(m) for m in repeated.values())
    q = f"How many different strings can be made by rearranging all the letters of the word {word}?"
    sol = (f"{word} has {len(word)} letters, with " + ", ".join(f"{c} appearing {m} times" for c, m in repeated.items())
           + f". The arrangements are {len(word)}! / (" + " ".join(f"{m}!" for m in repeated.values())
           + f") = {math.factorial(len(word))} / {den} = {math.factorial(len(word)) // den}.")
    return (q, sol, "Check: dividing by the factorials removes the swaps of equal letters.",
            sp.factorial(len(word)) / den, len(set(permutations(word))))


def c_gcd(r):
    a, b = r.randint(30, 400), r.randint(12, 300)
    steps, x, y = [], max(a, b), min(a, b)
    while y:
        steps.append(f"gcd({x}, {y})")
        x, y = y, x % y
    steps.append(str(x))
    q = f"What is the greatest common divisor of {a} and {b}?"
    sol = "By the Euclidean algorithm, gcd(a, b) = gcd(b, a mod b): " + " = ".join(steps) + "."
    return (q, sol, f"Check: {a} = {x} * {a // x} and {b} = {x} * {b // x}.", sp.gcd(a, b),
            max(d for d in range(1, min(a, b) + 1) if a % d == 0 == b % d))


def _factor_text(n: int) -> str:
    return " * ".join(f"{p}^{e}" if e > 1 else str(p) for p, e in sorted(sp.factorint(n).items()))


def c_divisor_count(r):
    n = r.randint(12, 1000)
    f = sorted(sp.factorint(n).items())
    q = f"How many positive divisors does {n} have?"
    sol = (f"The prime factorisation is {n} = {_factor_text(n)}. The number of divisors is the product of the exponents "
           f"plus one: " + " * ".join(f"({e} + 1)" for _, e in f) + f" = {math.prod(e + 1 for _, e in f)}.")
    return q, sol, "Check: each divisor picks an exponent for every prime independently.", sp.divisor_count(n), \
        sum(1 for d in range(1, n + 1) if n % d == 0)


def c_divisor_sum(r):
    n = r.randint(12, 400)
    f = sorted(sp.factorint(n).items())
    parts = [(p ** (e + 1) - 1) // (p - 1) for p, e in f]
    q = f"What is the sum of all positive divisors of {n}?"
    sol = (f"The prime factorisation is {n} = {_factor_text(n)}. The divisor sum is multiplicative, with "
           f"(p^(a+1) - 1) / (p - 1) for each prime power: " + " * ".join(str(v) for v in parts)
           + f" = {math.prod(parts)}.")
    return q, sol, f"Check: the divisors include 1 and {n}, so the sum exceeds {n}.", sp.divisor_sigma(n), \
        sum(d for d in range(1, n + 1) if n % d == 0)


def c_quadratic(r):
    p, q_ = r.randint(-12, 12), r.randint(-12, 12)
    b, c = -(p + q_), p * q_
    text = f"x^2 {_sign(b)}x {_sign(c)}".replace("+ 0x ", "").replace(" + 0", "").replace(" 1x", " x")
    which = r.choice(["sum", "product"])
    if which == "sum":
        q = f"What is the sum of the roots of {text} = 0?"
        sol = f"By Vieta's formulas the sum of the roots of x^2 + bx + c is -b; here b = {b}, so the sum is {-b}."
        return q, sol, f"Check: the roots are {p} and {q_}, and {p} + ({q_}) = {p + q_}.", sp.Integer(-b), p + q_
    q = f"What is the product of the roots of {text} = 0?"
    sol = f"By Vieta's formulas the product of the roots of x^2 + bx + c is c; here c = {c}."
    return q, sol, f"Check: the roots are {p} and {q_}, and {p} * ({q_}) = {c}.", sp.Integer(c), p * q_


def c_dice(r):
    s = r.randint(3, 11)
    pairs = [(i, s - i) for i in range(1, 7) if 1 <= s - i <= 6]
    q = f"Two fair six-sided dice are rolled. What is the probability that their sum is {s}?"
    sol = (f"There are 36 equally likely outcomes. The pairs with sum {s} are " + ", ".join(f"({i}, {j})" for i, j in pairs)
           + f": {len(pairs)} outcomes, so the probability is {len(pairs)}/36"
           + (f" = {sp.Rational(len(pairs), 36)}." if sp.Rational(len(pairs), 36).q != 36 else "."))
    return (q, sol, "Check: the probability lies between 0 and 1/6, the largest being for a sum of 7.",
            sp.Rational(len(pairs), 36), Fraction(sum(1 for i, j in product(range(1, 7), repeat=2) if i + j == s), 36))


def c_triangle(r):
    (x1, y1), (x2, y2), (x3, y3) = [(r.randint(-8, 8), r.randint(-8, 8)) for _ in range(3)]
    twice = x1 * (y2 - y3) + x2 * (y3 - y1) + x3 * (y1 - y2)
    if twice == 0:
        return c_triangle(r)
    q = f"What is the area of the triangle with vertices ({x1}, {y1}), ({x2}, {y2}) and ({x3}, {y3})?"
    sol = (f"By the shoelace formula the area is |x1(y2 - y3) + x2(y3 - y1) + x3(y1 - y2)| / 2 = "
           f"|{x1} * ({y2 - y3}) + {x2} * ({y3 - y1}) + {x3} * ({y1 - y2})| / 2 = |{twice}| / 2 = {sp.Rational(abs(twice), 2)}.")
    area = abs(sp.Matrix([[x1, y1, 1], [x2, y2, 1], [x3, y3, 1]]).det()) / 2
    return q, sol, "Check: the area is positive, so the points are not on one line.", area, Fraction(abs(twice), 2)


def c_derivative(r):
    a, b, c, n, at = r.randint(1, 5), r.randint(-6, 6), r.randint(-9, 9), r.randint(2, 4), r.randint(-3, 3)
    f = a * x ** n + b * x + c
    text = sp.sstr(f).replace("**", "^").replace("*", "")
    value = a * n * at ** (n - 1) + b
    q = f"Let f(x) = {text}. What is f'({at})?"
    lin = f" {_sign(b)}" if b else ""
    sol = (f"Differentiate term by term: f'(x) = {a * n}x^{n - 1}{lin}. At x = {at}: f'({at}) = {a * n} * ({at})^{n - 1}"
           f"{lin} = {value}.").replace("^1 ", " ").replace("^1.", ".")
    return q, sol, "Check: the constant term does not change the derivative.", sp.diff(f, x).subs(x, at), value


def c_integral(r):
    a, b, hi = r.randint(1, 6), r.randint(-5, 5), r.randint(1, 4)
    f = a * x ** 2 + b * x
    text = sp.sstr(f).replace("**", "^").replace("*", "")
    val = Fraction(a * hi ** 3, 3) + Fraction(b * hi ** 2, 2)
    q = f"Compute the integral of {text} from x = 0 to x = {hi}."
    lin, lin_at = (f" {_sign(b)}x^2/2", f" {_sign(b)} * {hi ** 2}/2") if b else ("", "")
    sol = (f"An antiderivative is {a}x^3/3{lin}. At x = {hi} it is {a} * {hi ** 3}/3{lin_at} "
           f"= {val}; at x = 0 it is 0, so the integral is {val}.").replace(" 1x^3", " x^3")
    return q, sol, "Check: the antiderivative's derivative is the integrand.", sp.integrate(f, (x, 0, hi)), val


# template -> the passage (passages.jsonl id) whose fact it uses
COLD = {c_series: "k02", c_binomial: "k04", c_word: "k06", c_gcd: "k09", c_divisor_count: "k10",
        c_divisor_sum: "k11", c_quadratic: "k17", c_dice: "k20", c_triangle: "k23", c_derivative: "k28",
        c_integral: "k29", c_linear: "k36"}
COLD_FILES = {"proposer": "pasodoble_cold_proposer.jsonl", "solver": "pasodoble_cold_solver.jsonl"}
N_COLD = 150  # records per role (the paper's 2K per role are a larger model's outputs)
PASO_PROMPTS = DATA.parent / "prompts" / "pasodoble"


def cold_start(rng: random.Random, exclude: set[str]) -> dict[str, list[dict]]:
    """Per role, N_COLD records, each a prompt, the
    role's system prompt and a completion in the role's output format; no question
    repeats or appears in `exclude` (the evaluation's held-out problems)."""
    from askspec.lang.sandbox import environment  # the sandbox the runtime renders prompts in

    env = environment()
    proposer = env.from_string((PASO_PROMPTS / "proposer.j2").read_text(encoding="utf-8"))
    proposer_system = env.from_string((PASO_PROMPTS / "proposer_system.j2").read_text(encoding="utf-8")).render()
    solver_system = env.from_string((PASO_PROMPTS / "solver_system.j2").read_text(encoding="utf-8")).render()
    texts = {p["id"]: p for p in passages()}
    templates = list(COLD)
    out: dict[str, list[dict]] = {}
    seen = set(exclude)
    tries = 0
    for split in ("proposer", "solver"):
        rows = out.setdefault(split, [])
        made = 0
        while made < N_COLD:
            t = templates[tries % len(templates)]
            tries += 1
            if tries > 100 * N_COLD:
                raise RuntimeError("the cold-start templates cannot make that many distinct problems")
            question, solution, check, exact, brute = t(rng)
            if question in seen:
                continue
            _agree(exact, brute)
            seen.add(question)
            made += 1
            answer = _ans(exact)
            row = {"id": f"c{split[0]}{made:03d}", "template": t.__name__, "answer": answer,
                   "_brute": str(brute), "_question": question}
            if split == "proposer":
                passage = texts[COLD[t]]
                # the prompt PasoDoble's spec renders by default (`knowledge = true`; profile no_k drops the passage)
                prompt = proposer.render(passage=passage, knowledge=True)
                row.update(passage=passage["id"], system=proposer_system, prompt=prompt,
                           completion=f"<problem>{question}</problem>\n<answer>{solution} {check} "
                                      f"The answer is \\boxed{{{answer}}}.</answer>")
            else:
                row.update(system=solver_system, prompt=question,
                           completion=f"{solution} The answer is \\boxed{{{answer}}}.")
            rows.append(row)
    return out


# ------------------------------------------------------------------ AskBench items
# AskBench's two dimensions (askbench.txt §3.1) built from a (query, answer) pair whose
# givens the template knows: AskMind removes the givens from the query and lists each as a
# rubric criterion (the information the user must supply); AskOverconfidence keeps the query
# verbatim and puts before it a confidently stated wrong intermediate claim, listed as the
# misleading point the assistant must correct. The paper asks an LLM for both (askbench_build.ask
# does); here the templates write them, so that every rubric item is a given of the original
# query and every injected claim is checked to be wrong. The answer is SymPy's, checked
# against a brute-force computation. Each template: rng -> dict with original, mind, mind_rubric,
# mind_context, claim, point, truth, claimed, actual, exact, brute (claimed != actual: the
# claim's value and the true one).

def a_committee(r):
    n = r.randint(6, 16)
    k = r.randint(2, min(5, n - 2))
    perm = math.perm(n, k)
    return dict(original=f"In how many ways can a committee of {k} be chosen from {n} people?",
                mind="In how many ways can a committee be chosen from a group of people?",
                mind_rubric=[f"The committee has {k} members", f"The group has {n} people"],
                mind_context=f"The committee's size ({k}) and the group's size ({n}) were removed.",
                claim=f"I know the order in which the members are picked matters for a committee, so the count is "
                      f"{n}!/{n - k}! = {perm}.",
                point=f"The order of a committee's members matters (the count {perm})",
                truth=f"a committee is unordered: C({n}, {k}) = {math.comb(n, k)}",
                claimed=perm, actual=math.comb(n, k), exact=sp.binomial(n, k),
                brute=sum(1 for bits in range(1 << n) if bin(bits).count("1") == k))


def a_rectangle(r):
    a, b = r.randint(3, 25), r.randint(3, 25)
    if a == b:
        return a_rectangle(r)
    perimeter = 2 * (a + b)
    return dict(original=f"A rectangle has a perimeter of {perimeter} cm and one side of {a} cm. "
                         f"What is its area in square centimetres?",
                mind="A rectangle has a certain perimeter and one known side. What is its area in square centimetres?",
                mind_rubric=[f"The perimeter is {perimeter} cm", f"One side is {a} cm long"],
                mind_context=f"The perimeter ({perimeter} cm) and the known side ({a} cm) were removed.",
                claim=f"The other side of a rectangle is its perimeter minus the known side, so here it is "
                      f"{perimeter - a} cm.",
                point=f"The other side is the perimeter minus the known side ({perimeter - a} cm)",
                truth=f"the other side is half the perimeter minus the known side, {b} cm",
                claimed=perimeter - a, actual=b, exact=sp.Integer(a) * (sp.Rational(perimeter, 2) - a),
                brute=a * next(w for w in range(1, perimeter) if 2 * (a + w) == perimeter))


def a_trip(r):
    speed, hours = r.choice(range(20, 125, 5)), r.randint(2, 9)
    distance = speed * hours
    return dict(original=f"A train travels {distance} km at a constant speed of {speed} km/h. "
                         f"How many hours does the trip take?",
                mind="A train travels some distance at a constant speed. How many hours does the trip take?",
                mind_rubric=[f"The distance is {distance} km", f"The speed is {speed} km/h"],
                mind_context=f"The distance ({distance} km) and the speed ({speed} km/h) were removed.",
                claim=f"Travel time is distance times speed, so this trip takes {distance * speed} hours.",
                point=f"Travel time is distance times speed ({distance * speed} hours)",
                truth=f"travel time is distance divided by speed, {hours} hours",
                claimed=distance * speed, actual=hours, exact=sp.Rational(distance, speed),
                brute=next(t for t in range(1, distance + 1) if t * speed == distance))


def a_linear(r):
    a, s, b = r.randint(2, 12), r.randint(-20, 20), r.randint(1, 30)
    c = a * s + b
    return dict(original=f"Solve for x: {a}x + {b} = {c}.",
                mind="Solve for x: some multiple of x plus a constant equals a number.",
                mind_rubric=[f"The coefficient of x is {a}", f"The constant term is {b}",
                             f"The right-hand side is {c}"],
                mind_context=f"The coefficient ({a}), the constant ({b}) and the right-hand side ({c}) were removed.",
                claim=f"Moving a constant to the other side of an equation keeps its sign, so {a}x = {c} + {b} = {c + b}.",
                point=f"Moving the constant across keeps its sign ({a}x = {c + b})",
                truth=f"the constant changes sign: {a}x = {c} - {b} = {c - b}",
                claimed=c + b, actual=c - b, exact=sp.solve(sp.Eq(a * x + b, c), x)[0],
                brute=next(v for v in range(-50, 51) if a * v + b == c))


def a_series(r):
    a, d, n = r.randint(1, 20), r.randint(2, 9), r.randint(5, 30)
    last = a + (n - 1) * d
    k = sp.Symbol("k")
    return dict(original=f"What is the sum of the first {n} terms of the arithmetic sequence that starts "
                         f"{a}, {a + d}, {a + 2 * d}, ...?",
                mind="What is the sum of the first terms of an arithmetic sequence?",
                mind_rubric=[f"The sequence starts {a}, {a + d}, {a + 2 * d}", f"The first {n} terms are summed"],
                mind_context=f"The sequence's first terms ({a}, {a + d}, {a + 2 * d}) and the number of terms ({n}) "
                             f"were removed.",
                claim=f"The sum of an arithmetic sequence is the number of terms times the last term, here "
                      f"{n} * {last} = {n * last}.",
                point=f"The sum is the number of terms times the last term ({n * last})",
                truth=f"the sum is the number of terms times the mean of the first and last terms, "
                      f"{n} * ({a} + {last}) / 2",
                claimed=n * last, actual=Fraction(n * (a + last), 2), exact=sp.summation(a + k * d, (k, 0, n - 1)),
                brute=sum(a + i * d for i in range(n)))


def a_pipes(r):
    a, b = r.randint(2, 15), r.randint(2, 15)
    if a == b:
        return a_pipes(r)
    together = Fraction(a * b, a + b)
    return dict(original=f"Pipe A fills a tank in {a} hours and pipe B fills it in {b} hours. "
                         f"Working together, how many hours do they take to fill the tank?",
                mind="Two pipes fill a tank, each at its own rate. Working together, how many hours do they take "
                     "to fill the tank?",
                mind_rubric=[f"Pipe A alone takes {a} hours", f"Pipe B alone takes {b} hours"],
                mind_context=f"The hours pipe A ({a}) and pipe B ({b}) take alone were removed.",
                claim=f"Two pipes together take the average of their times, so that is {_ans(Fraction(a + b, 2))} "
                      f"hours.",
                point=f"Together the pipes take the average of their times ({_ans(Fraction(a + b, 2))} hours)",
                truth=f"the rates add: 1/{a} + 1/{b}, so together they take {_ans(together)} hours",
                claimed=Fraction(a + b, 2), actual=together, exact=sp.Rational(a * b, a + b),
                brute=1 / (Fraction(1, a) + Fraction(1, b)))


def a_dice(r):
    m = r.choice([2, 3])
    s = r.randint(m + 1, 6 * m - 1)
    ways = sum(1 for roll in product(range(1, 7), repeat=m) if sum(roll) == s)
    count = {2: "Two", 3: "Three"}[m]
    return dict(original=f"{count} fair six-sided dice are rolled. What is the probability that the sum is {s}? "
                         f"Give a fraction.",
                mind=f"Some dice are rolled. What is the probability that the sum is {s}? Give a fraction.",
                mind_rubric=[f"{count} dice are rolled", "The dice are fair and six-sided"],
                mind_context=f"The number of dice ({m}) and their kind (fair, six-sided) were removed.",
                claim=f"With {m} dice every sum from {m} to {6 * m} is equally likely, so the answer is "
                      f"1/{5 * m + 1}.",
                point=f"Every sum from {m} to {6 * m} is equally likely (1/{5 * m + 1})",
                truth=f"sums are not equally likely: {ways} of the {6 ** m} rolls give {s}",
                claimed=Fraction(1, 5 * m + 1), actual=Fraction(ways, 6 ** m),
                exact=sp.Rational(ways, 6 ** m),
                brute=Fraction(sum(1 for i in product(range(1, 7), repeat=m) if sum(i) == s), 6 ** m))


def a_discount(r):
    price, off = r.choice(range(40, 420, 20)), r.choice([10, 15, 20, 25, 30, 35, 40, 45, 50])
    sale = Fraction(price * (100 - off), 100)
    return dict(original=f"A jacket costs {price} dollars and is sold at {off}% off. What is the sale price in "
                         f"dollars?",
                mind="A jacket is sold at a discount. What is the sale price in dollars?",
                mind_rubric=[f"The original price is {price} dollars", f"The discount is {off}%"],
                mind_context=f"The original price ({price} dollars) and the discount ({off}%) were removed.",
                claim=f"A {off}% discount takes {off} dollars off the price, so the jacket costs {price - off} dollars.",
                point=f"A {off}% discount takes {off} dollars off ({price - off} dollars)",
                truth=f"{off}% of {price} dollars is {_ans(Fraction(price * off, 100))} dollars off, "
                      f"a sale price of {_ans(sale)}",
                claimed=price - off, actual=sale, exact=sp.Rational(price * (100 - off), 100),
                brute=price - Fraction(price * off, 100))


# the training pool's templates (§4.1: the paper's pool is DAPO and MedMCQA) and the evaluation
# set's: fresh problems of the same templates (in-domain, as Math500 / MedQA) and two templates
# the pool never has (out-of-domain, as GPQA-d / BBH; §3.2)
ASKBENCH_TRAIN = [a_committee, a_rectangle, a_trip, a_linear, a_series, a_pipes]
ASKBENCH_HELD_OUT = [a_dice, a_discount]
ASKBENCH_FILES = {"train": "askbench_train.jsonl", "test": "askbench_test.jsonl"}
N_ASKBENCH = {"train": 120, "test": 40}  # source problems; each gives an AskMind and an AskOverconfidence item


def askbench_items(rng: random.Random) -> dict[str, list[dict]]:
    """Per split, the AskMind then the AskOverconfidence item of each source problem, in
    askbench.ask's record layout (id, kind, original_query, query, context, answer, rubric).
    No original query is in both splits; the test split's last quarter is the held-out
    templates'."""
    seen: set[str] = set()
    out: dict[str, list[dict]] = {}
    for split, n in N_ASKBENCH.items():
        if split == "train":
            plan = [ASKBENCH_TRAIN[i % len(ASKBENCH_TRAIN)] for i in range(n)]
        else:
            held = n // 4
            plan = ([ASKBENCH_TRAIN[i % len(ASKBENCH_TRAIN)] for i in range(n - held)]
                    + [ASKBENCH_HELD_OUT[i % len(ASKBENCH_HELD_OUT)] for i in range(held)])
        minds, overs = [], []
        for i, t in enumerate(plan):
            for _ in range(200):
                item = t(rng)
                if item["original"] not in seen:
                    break
            else:
                raise RuntimeError(f"{t.__name__} cannot make that many distinct problems")
            seen.add(item["original"])
            _agree(item["exact"], item["brute"])
            if sp.nsimplify(item["claimed"]) == sp.nsimplify(item["actual"]):
                raise AssertionError(f"{t.__name__}: the injected claim is true: {item['claim']}")
            pid = f"{split}-{i + 1:03d}"
            answer = _ans(item["exact"])
            common = {"original_query": item["original"], "answer": answer, "_brute": str(item["brute"]),
                      "_template": t.__name__, "_claimed": str(item["claimed"]), "_actual": str(item["actual"])}
            minds.append({"id": f"mind-{pid}", "kind": "ask_mind", "original_query": item["original"],
                          "query": item["mind"], "context": item["mind_context"], "answer": answer,
                          "rubric": item["mind_rubric"], **common})
            overs.append({"id": f"over-{pid}", "kind": "ask_overconfidence", "original_query": item["original"],
                          "query": f"{item['claim']} {item['original']}",
                          "context": f"incorrect assertion -> {item['point']} -> correct fact -> {item['truth']}",
                          "answer": answer, "rubric": [item["point"]], **common})
        out[split] = minds + overs
    return out


def passages() -> list[dict]:
    return [{"id": f"k{i + 1:02d}", "text": t} for i, t in enumerate(PASSAGES)]


def generate(seed: int = SEED) -> dict[str, list[dict]]:
    """File name -> rows; problem rows carry `_brute`, the brute-force answer (not written)."""
    rng = random.Random(seed)
    math_items = problems(STANDARD, N_MATH, rng, "m")
    for i, item in enumerate(math_items):
        item["split"] = "test" if i >= N_MATH - MATH_TEST else "train"
    hard = problems(HARD, N_HARD, random.Random(seed + 1), "h")
    test = set(random.Random(seed + 2).sample(range(len(hard)), int(len(hard) * HARD_TEST_SHARE)))
    for i, item in enumerate(hard):
        item["split"] = "test" if i in test else "train"

    # after the others, so that adding it changed none of their draws
    cold = cold_start(random.Random(seed + 3), {m["question"] for m in math_items})
    askbench = askbench_items(random.Random(seed + 4))  # after the others, for the same reason
    return {MATH_FILE: math_items, HARD_FILE: hard, PASSAGES_FILE: passages(),
            **{COLD_FILES[role]: rows for role, rows in cold.items()},
            **{ASKBENCH_FILES[split]: rows for split, rows in askbench.items()}}


def build(seed: int = SEED) -> dict[str, str]:
    """File name -> exact content, for the given seed."""
    def jsonl(rows):
        return "".join(json.dumps({k: v for k, v in r.items() if not k.startswith("_")}, ensure_ascii=False) + "\n"
                       for r in rows)

    return {name: jsonl(rows) for name, rows in generate(seed).items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--check", action="store_true", help="only compare with the shipped files")
    args = ap.parse_args()
    stale = []
    for name, text in build(args.seed).items():
        path = DATA / name
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print("differs from the generator: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
