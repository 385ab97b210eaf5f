// Null densities for the cosine charts (drawing only; the audit's math lives in the service).

/** log Gamma(x) for x > 0 (Lanczos, g = 7). */
export function logGamma(x) {
  const c = [0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313, -176.61502916214059, 12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6, 1.5056327351493116e-7];
  if (x < 0.5) return Math.log(Math.PI / Math.abs(Math.sin(Math.PI * x))) - logGamma(1 - x);
  x -= 1;
  let a = c[0];
  const t = x + 7.5;
  for (let i = 1; i < 9; i++) a += c[i] / (x + i);
  return 0.5 * Math.log(2 * Math.PI) + (x + 0.5) * Math.log(t) - t + Math.log(a);
}

/** Exact density of cos(c, v) for c uniform on the unit sphere in d >= 3 dimensions:
 * Gamma(d/2) / (sqrt(pi) Gamma((d-1)/2)) (1 - t^2)^((d-3)/2). */
export function sphereCosineDensity(t, d) {
  if (Math.abs(t) >= 1) return 0;
  const logc = logGamma(d / 2) - 0.5 * Math.log(Math.PI) - logGamma((d - 1) / 2);
  return Math.exp(logc + ((d - 3) / 2) * Math.log1p(-t * t));
}

/** erfc(x) with relative error < 1.2e-7 (Numerical Recipes' Chebyshev fit). */
export function erfc(x) {
  const z = Math.abs(x);
  const t = 1 / (1 + 0.5 * z);
  const r =
    t *
    Math.exp(
      -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))),
    );
  return x >= 0 ? r : 2 - r;
}

/** log of the standard normal CDF. */
export function logNormalCdf(z) {
  return Math.log(0.5 * erfc(-z / Math.SQRT2));
}

/** log density of the maximum of T independent N(0, 1/d) cosines:
 * log T + (T - 1) log Phi(x sqrt(d)) + log phi_{1/d}(x). */
export function logMaxNullDensity(x, d, T) {
  const z = x * Math.sqrt(d);
  const logPdf = 0.5 * Math.log(d / (2 * Math.PI)) - (z * z) / 2;
  if (T <= 1) return logPdf;
  return Math.log(T) + (T - 1) * logNormalCdf(z) + logPdf;
}
