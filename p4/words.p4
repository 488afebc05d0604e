/* words.p4: the payload word list, shared by the v1model program and the Tofino program.
 *
 * FOR_EACH_WORD(X) expands X(NN, I) for every payload word: NN the two-digit name suffix of the
 * word's register, I its index in the words[] header stack (headers.p4), I = 0 .. P4_WORDS - 1.
 */
#ifndef HOMAGG_WORDS_P4
#define HOMAGG_WORDS_P4

/* X(NN, I): register name suffix NN, header stack index I, for the P4_WORDS payload words. */
#define FOR_EACH_WORD(X) \
    X(00, 0) X(01, 1) X(02, 2) X(03, 3) \
    X(04, 4) X(05, 5) X(06, 6) X(07, 7) \
    X(08, 8) X(09, 9) X(10, 10) X(11, 11) \
    X(12, 12) X(13, 13) X(14, 14) X(15, 15) \
    X(16, 16) X(17, 17) X(18, 18) X(19, 19) \
    X(20, 20) X(21, 21) X(22, 22) X(23, 23) \
    X(24, 24) X(25, 25) X(26, 26) X(27, 27) \
    X(28, 28) X(29, 29) X(30, 30) X(31, 31)

#endif
