/* words.p4: the payload word list, shared by the v1model program and the Tofino program.
 *
 * The one list: entry k (k = 1 .. P4_WORDS) is X(NN, I, N) for payload word I = k - 1, NN the
 * two-digit name suffix of its register, I its index in the words[] header stack (headers.p4),
 * N = I + 1 the word count of a packet whose last word it is (the Tofino parser's next state).
 * WORDS_UPTO_k(X) expands the first k entries, in order.
 *
 *   FOR_EACH_WORD(X)          every payload word (P4_WORDS = 32): the v1model program
 *   FOR_FIRST_WORDS(K, X)     the first K words, K an integer literal or a macro defined as one
 *                             (the Tofino program: K = TOFINO_WORDS, its words per pass)
 */
#ifndef HOMAGG_WORDS_P4
#define HOMAGG_WORDS_P4

#define WORDS_UPTO_0(X)
#define WORDS_UPTO_1(X) WORDS_UPTO_0(X) X(00, 0, 1)
#define WORDS_UPTO_2(X) WORDS_UPTO_1(X) X(01, 1, 2)
#define WORDS_UPTO_3(X) WORDS_UPTO_2(X) X(02, 2, 3)
#define WORDS_UPTO_4(X) WORDS_UPTO_3(X) X(03, 3, 4)
#define WORDS_UPTO_5(X) WORDS_UPTO_4(X) X(04, 4, 5)
#define WORDS_UPTO_6(X) WORDS_UPTO_5(X) X(05, 5, 6)
#define WORDS_UPTO_7(X) WORDS_UPTO_6(X) X(06, 6, 7)
#define WORDS_UPTO_8(X) WORDS_UPTO_7(X) X(07, 7, 8)
#define WORDS_UPTO_9(X) WORDS_UPTO_8(X) X(08, 8, 9)
#define WORDS_UPTO_10(X) WORDS_UPTO_9(X) X(09, 9, 10)
#define WORDS_UPTO_11(X) WORDS_UPTO_10(X) X(10, 10, 11)
#define WORDS_UPTO_12(X) WORDS_UPTO_11(X) X(11, 11, 12)
#define WORDS_UPTO_13(X) WORDS_UPTO_12(X) X(12, 12, 13)
#define WORDS_UPTO_14(X) WORDS_UPTO_13(X) X(13, 13, 14)
#define WORDS_UPTO_15(X) WORDS_UPTO_14(X) X(14, 14, 15)
#define WORDS_UPTO_16(X) WORDS_UPTO_15(X) X(15, 15, 16)
#define WORDS_UPTO_17(X) WORDS_UPTO_16(X) X(16, 16, 17)
#define WORDS_UPTO_18(X) WORDS_UPTO_17(X) X(17, 17, 18)
#define WORDS_UPTO_19(X) WORDS_UPTO_18(X) X(18, 18, 19)
#define WORDS_UPTO_20(X) WORDS_UPTO_19(X) X(19, 19, 20)
#define WORDS_UPTO_21(X) WORDS_UPTO_20(X) X(20, 20, 21)
#define WORDS_UPTO_22(X) WORDS_UPTO_21(X) X(21, 21, 22)
#define WORDS_UPTO_23(X) WORDS_UPTO_22(X) X(22, 22, 23)
#define WORDS_UPTO_24(X) WORDS_UPTO_23(X) X(23, 23, 24)
#define WORDS_UPTO_25(X) WORDS_UPTO_24(X) X(24, 24, 25)
#define WORDS_UPTO_26(X) WORDS_UPTO_25(X) X(25, 25, 26)
#define WORDS_UPTO_27(X) WORDS_UPTO_26(X) X(26, 26, 27)
#define WORDS_UPTO_28(X) WORDS_UPTO_27(X) X(27, 27, 28)
#define WORDS_UPTO_29(X) WORDS_UPTO_28(X) X(28, 28, 29)
#define WORDS_UPTO_30(X) WORDS_UPTO_29(X) X(29, 29, 30)
#define WORDS_UPTO_31(X) WORDS_UPTO_30(X) X(30, 30, 31)
#define WORDS_UPTO_32(X) WORDS_UPTO_31(X) X(31, 31, 32)

#define FOR_EACH_WORD(X) WORDS_UPTO_32(X)
#define FOR_FIRST_WORDS(K, X) FOR_FIRST_WORDS_(K, X)
#define FOR_FIRST_WORDS_(K, X) WORDS_UPTO_##K(X)

#endif
